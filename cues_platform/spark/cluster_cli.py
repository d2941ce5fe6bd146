"""``cues spark cluster up|down|status``: a standalone Spark cluster on this machine
(:mod:`cues_platform.spark.cluster`), remembered in ``DIR/state.json`` (PIDs, ports, folder).

``up`` refuses to start a second cluster in a folder whose cluster still runs; ``down`` stops what
the state file names (processes that are already gone, or a state file that is missing, are
said so in one line, not a traceback); ``status`` asks the Master which workers are ALIVE.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cues_platform.spark import state
from cues_platform.spark.cluster import Cluster, start_cluster
from cues_platform.spark.daemons import ClusterError, daemon_alive

DEFAULT_DIR = Path(".cues") / "spark-cluster"
STATE = state.STATE
dir_option = state.dir_option(DEFAULT_DIR, "cluster")


class ClusterAlreadyRunningError(ClusterError):
    """``up`` where a cluster of the same folder still runs."""


def read_state(folder: Path) -> Cluster | None:
    return state.read_state(folder, parse=Cluster.from_dict, error=ClusterError, what="cluster",
                            fix="stop any Spark daemons it started by their PIDs (logs/ names them) "
                                "and delete it")


def write_state(folder: Path, cluster: Cluster) -> None:
    state.write_state(folder, cluster.to_dict())


def running(cluster: Cluster) -> list[str]:
    """The roles of the cluster's daemons that still run (checked by PID and command line)."""
    return [d.role for d in (cluster.master, *cluster.workers) if daemon_alive(d.pid, folder=cluster.folder)]


@click.group("cluster")
def cluster() -> None:
    """A standalone Spark cluster (a Master and Workers on 127.0.0.1) for CUES_SPARK_MASTER."""


@cluster.command("up")
@dir_option
@click.option("--workers", default=2, show_default=True, help="Worker processes.")
@click.option("--cores", default=2, show_default=True,
              help="Cores each worker offers (an application takes one per worker: two share a worker).")
@click.option("--memory", default="2g", show_default=True, help="Memory each worker offers (e.g. 2g).")
@click.option("--cores-per-app", type=int, default=None,
              help="Cores one application gets in all (default: one per worker).")
@click.option("--port", default=0, show_default=True, help="The master's port (0: a free one).")
@click.option("--timeout", default=120.0, show_default=True, help="Seconds to wait for every worker.")
def up(folder: Path, workers: int, cores: int, memory: str, cores_per_app: int | None, port: int,
       timeout: float) -> None:
    """Start the Master and Workers; print the master URL and the export line."""
    previous = read_state(folder)
    if previous is not None and running(previous):
        raise ClusterAlreadyRunningError(
            f"a cluster started from {folder} still runs at {previous.url} ({', '.join(running(previous))}): "
            f"use it (export CUES_SPARK_MASTER={previous.url}), or stop it with "
            f"`cues spark cluster down --dir {folder}` first, or pass another --dir", url=previous.url)
    if previous is not None:
        click.echo(f"note: the earlier cluster of {folder} ({previous.url}) is gone; starting a new one")
    folder.mkdir(parents=True, exist_ok=True)
    started = start_cluster(folder=folder, workers=workers, cores=cores, memory=memory,
                            cores_per_app=cores_per_app, port=port, timeout=timeout)
    write_state(folder, started)
    click.echo(f"Spark standalone cluster up: {started.url} ({workers} worker(s), master UI {started.webui})")
    click.echo(f"export CUES_SPARK_MASTER={started.url}")


@cluster.command("status")
@dir_option
def status(folder: Path) -> None:
    """Say whether the cluster runs and which workers the Master lists ALIVE (exit 1 if not up)."""
    found = read_state(folder)
    if found is None:
        click.echo(f"no cluster: no state file in {folder} (start one with `cues spark cluster up`)")
        sys.exit(1)
    alive = running(found)
    if found.master.role not in alive:
        click.echo(f"down: the master of {found.url} no longer runs (stale state file {folder / STATE}; "
                   f"`cues spark cluster down --dir {folder}` clears it)")
        sys.exit(1)
    try:
        info = found.status()
    except OSError as exc:
        raise ClusterError(f"the master of {found.url} runs (pid {found.master.pid}) but its UI {found.webui} "
                           f"does not answer ({exc}): see its log {found.master.log}; if it hangs, "
                           f"`cues spark cluster down --dir {folder}` and up again", url=found.url) from exc
    workers = [w for w in info["workers"] if w["state"] == "ALIVE"]
    click.echo(f"up: {found.url} (master pid {found.master.pid}, UI {found.webui})")
    click.echo(f"workers ALIVE: {len(workers)} of {len(found.workers)} started; cores {info['cores']}, "
               f"in use {info['coresused']}; applications running: {len(info['activeapps'])}")
    click.echo(f"export CUES_SPARK_MASTER={found.url}")


@cluster.command("down")
@dir_option
@state.grace_option
def down(folder: Path, grace: float) -> None:
    """Stop the daemons the state file names (by PID) and remove their work folders."""
    found = read_state(folder)
    if found is None:
        click.echo(f"no cluster to stop: no state file in {folder} (nothing was started there, or it was "
                   "stopped already)")
        return
    stopped = found.stop(grace=grace)
    (folder / STATE).unlink(missing_ok=True)
    if stopped:
        click.echo(f"stopped {found.url}: {len(stopped)} process(es) (pids {', '.join(map(str, stopped))}); "
                   f"logs kept in {Path(found.folder) / 'logs'}")
    else:
        click.echo(f"{found.url} was not running any more (stale state file, now removed); nothing to stop")
