"""``cues run GRAPH``: run a graph continuously; stop gracefully on SIGTERM/Ctrl-C."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from cues_platform.cli.common import lake_option
from cues_platform.processing.errors import PlatformStepError
from cues_platform.processing.events import RunnerStatus
from cues_platform.processing.failures import Origin, Phase, origin_of
from cues_platform.processing.graph import Graph
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
    run = _Run(graph=load_graph(graph_ref), lake=Lake(root=lake_root), no_progress=no_progress,
               status_file=status_file)
    # Step 1: signals and the py4j filter, for the whole command (a stop during Spark's start-up
    # is graceful too; GraphRunner.run installs its own while it runs and puts these back)
    with run.stoppable():
        # Step 2: Spark, then the runner until a stop, --idle-exit or a failure
        run.execute(idle_exit=idle_exit)
    # Step 3: one line, and one per processor
    run.report(idle_exit=idle_exit)


class _Run:
    """One ``cues run``: its runner, the stop request, and what it tells the user."""

    def __init__(self, *, graph: Graph, lake: Lake, no_progress: bool,
                 status_file: Path | None) -> None:
        self.graph, self.lake, self.no_progress = graph, lake, no_progress
        self.events = RunnerStatus(graph=graph.name, stream=sys.stderr if no_progress else None,
                                   status_file=status_file)
        self.stop = threading.Event()
        self.runners: list[GraphRunner] = []
        self.signals = StopSignals(self._request_stop)
        self.started = time.monotonic()
        self.interrupted = ""
        self.stats: dict[str, Any] = {}

    def _request_stop(self, _signum: int) -> None:  # in StopSignals' thread (never the handler)
        self.stop.set()
        for r in self.runners:
            r.stop_event.set()

    def stop_requested(self) -> bool:
        return (self.signals.received is not None or self.stop.is_set()
                or any(r.stop_event.is_set() for r in self.runners))

    def _quiet_py4j_after_stop(self, record: logging.LogRecord) -> bool:
        # py4j logs every command the stopped JVM can no longer answer (with a traceback) on the
        # root logger; after a stop request that is expected, and the step is left to recovery.
        return not (self.stop_requested() and f"{os.sep}py4j{os.sep}" in record.pathname)

    @contextmanager
    def stoppable(self) -> Iterator[None]:
        logging.getLogger().addFilter(self._quiet_py4j_after_stop)
        self.signals.__enter__()
        try:
            yield
        finally:
            self.signals.__exit__(None, None, None)
            logging.getLogger().removeFilter(self._quiet_py4j_after_stop)

    def _spark(self) -> Any:
        spark_started = time.monotonic()
        try:
            spark = get_spark()
        except Exception as exc:
            if not self.stop_requested():
                raise
            # Spark's start failed after a stop was requested (its JVM, in a group of its own, is
            # not signalled by a group stop; it may have died of something else)
            raise _StartupInterrupted(type(exc).__name__) from exc
        self.events("spark_ready", {"seconds": round(time.monotonic() - spark_started, 3)})
        return spark

    def execute(self, *, idle_exit: float | None) -> None:
        self.events("started", {"lake": self.lake.root, "pid": os.getpid(),
                                "processors": sorted(self.graph.processors)})
        try:
            runner = GraphRunner(graph=self.graph, lake=self.lake, spark=self._spark(),
                                 keep_results=False, events=self.events)
            self.runners.append(runner)
            if self.stop_requested():
                runner.stop_event.set()
            self.stats = runner.run(show_progress=not self.no_progress, idle_exit=idle_exit)
        except _StartupInterrupted as exc:
            self.interrupted = f"; start-up interrupted ({exc})"
        except Exception as exc:
            interrupted = self._interrupted_by_stop(exc)
            if interrupted is None:
                self.events("failed", {"error_type": type(exc).__name__,
                                       "error": (str(exc).strip().splitlines() or [""])[0][:300]})
                raise
            self.interrupted = interrupted
            self.stats = self.runners[0].stats if self.runners else {}

    def _interrupted_by_stop(self, exc: Exception) -> str | None:
        """What a failure under a stop request interrupted (None: not a stop's doing).

        A stop request that also took Spark's JVM down (SIGTERM to the process group) fails the
        step in flight (or the start-up) with a platform error: no error row, retried on
        restart."""
        if not self.stop_requested() or not (
            isinstance(exc, PlatformStepError)
            or origin_of(exc, phase=Phase.MATERIALIZE) is Origin.PLATFORM
        ):
            return None
        if isinstance(exc, PlatformStepError):
            return (f"; step {exc.step} of processor {exc.processor!r} was interrupted and is "
                    "retried on the next start")
        return f"; start-up interrupted ({type(exc).__name__})"

    def report(self, *, idle_exit: float | None) -> None:
        elapsed = time.monotonic() - self.started
        why = "stop requested" if self.stop_requested() else f"idle for {idle_exit}s"
        self.events("stopped", {"why": why + self.interrupted, "seconds": round(elapsed, 3)})
        click.echo(f"graph {self.graph.name}: stopped after {elapsed:.1f}s ({why}{self.interrupted})")
        # with the lanes of partitions added meanwhile
        final = self.runners[0].graph if self.runners else self.graph
        for pid, s in self.stats.items():
            p = final.processors[pid]
            click.echo(
                f"  {pid} ({p.kind.value}, {p.strategy.value}): {s.steps} step(s), "
                f"{s.rows_in:,} row(s) in, {s.rows_out:,} row(s) out, {s.errors} error(s), "
                f"{s.recovered} recovered"
            )


class _StartupInterrupted(Exception):  # noqa: N818 - a requested stop, reported in one line
    """A stop request arrived while Spark was starting and the start failed with it."""


__all__ = ["run_command"]
