"""``cues run GRAPH``: run a graph continuously; stop gracefully on SIGTERM/Ctrl-C."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

import click

from cues_platform.cli.common import lake_option
from cues_platform.processing.errors import PlatformStepError
from cues_platform.processing.events import RunnerStatus
from cues_platform.processing.failures import Origin, Phase, origin_of
from cues_platform.processing.loader import load_graph
from cues_platform.processing.runner import GraphRunner
from cues_platform.queues import Lake
from cues_platform.signals import StopSignals
from cues_platform.spark import get_spark


@click.command("run")
@click.argument("graph_ref", metavar="GRAPH")
@lake_option
@click.option(
    "--idle-exit",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Stop after this many seconds without work (default: run until SIGTERM / Ctrl-C).",
)
@click.option("--no-progress", is_flag=True,
              help="No live progress table: one JSON line per event on stderr instead.")
@click.option("--status-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Keep the runner's state (JSON, replaced atomically on every event) in this file.")
def run_command(graph_ref: str, lake_root: str, idle_exit: float | None, no_progress: bool,
                status_file: Path | None) -> None:
    """Run a graph (module:attr or file.py:attr) continuously; stop gracefully on SIGTERM/Ctrl-C.

    Events (started, spark_ready, recovered, step, idle, fenced, stopped, failed): one JSON line
    each on stderr with ``--no-progress``, and the latest state in ``--status-file``
    (cues_platform/processing/events.py).

    Exit 0 after a requested stop (SIGTERM/SIGINT) or ``--idle-exit``: the step in flight
    finishes, then one line. A SIGTERM to the whole process group is the same stop: Spark's JVM
    runs in a process group of its own (spark/session.py), hears nothing, and exits after this
    process. Should the JVM die under a requested stop anyway (killed on its own), the step in
    flight fails with a platform error, which writes no error row and is retried by the next start;
    that is still a requested stop (exit 0, one line naming the interrupted step). A platform
    failure without a stop request exits 2 with one ``error:`` line (``PlatformStepError``: restart
    to retry the same input).
    """
    graph = load_graph(graph_ref)
    lake = Lake(root=lake_root)
    events = RunnerStatus(graph=graph.name, stream=sys.stderr if no_progress else None,
                          status_file=status_file)
    stop = threading.Event()
    runners: list[GraphRunner] = []

    def request_stop(_signum: int) -> None:  # in StopSignals' thread (never in the handler)
        stop.set()
        for r in runners:
            r.stop_event.set()

    signals = StopSignals(request_stop)

    def stop_requested() -> bool:
        return signals.received is not None or stop.is_set() or any(r.stop_event.is_set() for r in runners)

    def quiet_py4j_after_stop(record: logging.LogRecord) -> bool:
        # py4j logs every command the stopped JVM can no longer answer (with a traceback) on the
        # root logger; after a stop request that is expected, and the step is left to recovery.
        return not (stop_requested() and f"{os.sep}py4j{os.sep}" in record.pathname)

    logging.getLogger().addFilter(quiet_py4j_after_stop)
    # Installed for the whole command, so a stop during start-up (Spark takes seconds) is graceful
    # too; GraphRunner.run installs its own while it runs and puts these back.
    signals.__enter__()
    started = time.monotonic()
    interrupted = ""
    events("started", {"lake": lake.root, "pid": os.getpid(), "processors": sorted(graph.processors)})
    try:
        spark_started = time.monotonic()
        try:
            spark = get_spark()
        except Exception as exc:
            if not stop_requested():
                raise
            # Spark's start failed after a stop was requested (its JVM, in a group of its own, is
            # not signalled by a group stop; it may have died of something else)
            raise _StartupInterrupted(type(exc).__name__) from exc
        events("spark_ready", {"seconds": round(time.monotonic() - spark_started, 3)})
        runner = GraphRunner(graph=graph, lake=lake, spark=spark, keep_results=False, events=events)
        runners.append(runner)
        if stop_requested():
            runner.stop_event.set()
        stats = runner.run(show_progress=not no_progress, idle_exit=idle_exit)
    except _StartupInterrupted as exc:
        interrupted = f"; start-up interrupted ({exc})"
        stats = {}
    except Exception as exc:
        # A stop request that also took Spark's JVM down (SIGTERM to the process group) fails the
        # step in flight (or the start-up) with a platform error: no error row, retried on restart.
        if not stop_requested() or not (
            isinstance(exc, PlatformStepError) or origin_of(exc, phase=Phase.MATERIALIZE) is Origin.PLATFORM
        ):
            events("failed", {"error_type": type(exc).__name__,
                              "error": (str(exc).strip().splitlines() or [""])[0][:300]})
            raise
        if isinstance(exc, PlatformStepError):
            interrupted = (f"; step {exc.step} of processor {exc.processor!r} was interrupted and is "
                           "retried on the next start")
        else:
            interrupted = f"; start-up interrupted ({type(exc).__name__})"
        stats = runners[0].stats if runners else {}
    finally:
        signals.__exit__(None, None, None)
        logging.getLogger().removeFilter(quiet_py4j_after_stop)
    elapsed = time.monotonic() - started
    why = (
        "stop requested" if stop_requested() else f"idle for {idle_exit}s"
    )
    events("stopped", {"why": why + interrupted, "seconds": round(elapsed, 3)})
    click.echo(f"graph {graph.name}: stopped after {elapsed:.1f}s ({why}{interrupted})")
    final = runners[0].graph if runners else graph  # with the lanes of partitions added meanwhile
    for pid, s in stats.items():
        p = final.processors[pid]
        click.echo(
            f"  {pid} ({p.kind.value}, {p.strategy.value}): {s.steps} step(s), {s.rows_in:,} row(s) "
            f"in, {s.rows_out:,} row(s) out, {s.errors} error(s), {s.recovered} recovered"
        )


class _StartupInterrupted(Exception):  # noqa: N818 - a requested stop, reported in one line
    """A stop request arrived while Spark was starting and the start failed with it."""


__all__ = ["run_command"]
