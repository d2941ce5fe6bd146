"""``cues spark connect up|down|status``: a Spark Connect server on this machine
(:mod:`cues_platform.spark.connect`), remembered in ``DIR/state.json`` (PID, port, master).

``up`` starts the server in the background and returns once it accepts sessions; it refuses a
second server in a folder whose server still runs. ``down`` stops what the state file names;
``status`` says whether it runs (exit 1 if not). A missing or stale state file is one line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cues_platform.spark import state
from cues_platform.spark.connect import ConnectServer, ConnectServerError, start_connect_server

DEFAULT_DIR = Path(".cues") / "spark-connect"
STATE = state.STATE
dir_option = state.dir_option(DEFAULT_DIR, "server")


class ConnectAlreadyRunningError(ConnectServerError):
    """``up`` where a server of the same folder still runs."""


def read_state(folder: Path) -> ConnectServer | None:
    return state.read_state(folder, parse=ConnectServer.from_dict, error=ConnectServerError,
                            what="Connect server", fix="stop the server by its PID (its log names "
                                                       "it) and delete the file")


def write_state(folder: Path, server: ConnectServer) -> None:
    state.write_state(folder, server.to_dict())


@click.group("connect")
def connect() -> None:
    """A Spark Connect server (sc://127.0.0.1:PORT) that runs and Dagster runs attach to."""


@connect.command("up")
@dir_option
@click.option("--port", default=0, show_default=True, help="The server's port (0: a free one).")
@click.option("--master", default="local[*]", show_default=True,
              help="The server's own Spark: local[*], or a cluster (spark://...).")
@click.option("--python-path", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=Path("."), show_default=True,
              help="Folder the server's Python workers import processor code from.")
@click.option("--timeout", default=180.0, show_default=True, help="Seconds to wait for the server.")
def up(folder: Path, port: int, master: str, python_path: Path, timeout: float) -> None:
    """Start the server; print its URL and the export line."""
    previous = read_state(folder)
    if previous is not None and previous.running():
        raise ConnectAlreadyRunningError(
            f"a Connect server started from {folder} still runs at {previous.url}: use it (export "
            f"CUES_SPARK_MASTER={previous.url}), or stop it with `cues spark connect down --dir "
            f"{folder}` first, or pass another --dir", url=previous.url)
    server = start_connect_server(folder=folder, port=port, master=master,
                                  python_path=python_path, timeout=timeout)
    write_state(folder, server)
    click.echo(f"Spark Connect server up: {server.url} (Spark {server.master}, pid {server.pid}, "
               f"log {server.log})")
    click.echo(f"export CUES_SPARK_MASTER={server.url}")


@connect.command("status")
@dir_option
def status(folder: Path) -> None:
    """Say whether the server runs (exit 1 if not)."""
    found = read_state(folder)
    if found is None:
        click.echo(f"no Connect server: no state file in {folder} (start one with "
                   "`cues spark connect up`)")
        sys.exit(1)
    if not found.running():
        click.echo(f"down: the server of {found.url} no longer runs (stale state file "
                   f"{folder / STATE}; `cues spark connect down --dir {folder}` clears it)")
        sys.exit(1)
    click.echo(f"up: {found.url} (Spark {found.master}, pid {found.pid}, log {found.log})")
    click.echo(f"export CUES_SPARK_MASTER={found.url}")


@connect.command("down")
@dir_option
@state.grace_option
def down(folder: Path, grace: float) -> None:
    """Stop the server the state file names (by PID)."""
    found = read_state(folder)
    if found is None:
        click.echo(f"no Connect server to stop: no state file in {folder} (nothing was started "
                   "there, or it was stopped already)")
        return
    stopped = found.stop(grace=grace)
    (folder / STATE).unlink(missing_ok=True)
    if stopped:
        click.echo(f"stopped {found.url} (pid {found.pid}); log kept in {found.log}")
    else:
        click.echo(f"{found.url} was not running any more (stale state file, now removed); "
                   "nothing to stop")


__all__ = ["connect"]
