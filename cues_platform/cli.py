"""The ``cues`` command (click, Dagster's own CLI library)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from cues_platform.audit.discovery import queue_folders
from cues_platform.audit.exit import exit_with
from cues_platform.audit.storage import (
    STORAGE_ERRORS,
    first_line,
    open_checked,
    unreadable_error,
    unwritable_error,
)
from cues_platform.commands.common import open_lake
from cues_platform.errors import CuesError
from cues_platform.oneline import EXIT_BAD_INPUT, EXIT_BUG, bug_hint, fail
from cues_platform.participants.cli import participant
from cues_platform.queues import Lake, Queue

console = Console()
DEFAULT_LAKE = os.environ.get("CUES_LAKE", "lake")
lake_option = click.option(
    "--lake",
    "lake_root",
    default=DEFAULT_LAKE,
    show_default=True,
    envvar="CUES_LAKE",
    help="Lake root: a folder or a delta-rs URI.",
)



class CuesGroup(click.Group):
    """Every failure is one line on stderr and a non-zero exit, never a traceback: a CuesError
    (what was wrong and what to do) or a storage fault exits 2, an unexpected exception (a bug)
    exits 3 with a hint to rerun with ``CUES_DEBUG=1``, which prints the traceback too."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # usage errors and --help: click's own handling
        except CuesError as exc:
            fail(str(exc), exc, EXIT_BAD_INPUT)
        except STORAGE_ERRORS as exc:  # not translated where it was raised: still one line
            fail(f"storage error: {first_line(exc)}; check --lake, the lake's files and their "
                 "permissions (`cues audit` lists every damaged table)", exc, EXIT_BAD_INPUT)
        except Exception as exc:  # noqa: BLE001 - the last resort of a command line: one line
            fail(f"unexpected {type(exc).__name__}: {first_line(exc)} {bug_hint()}", exc, EXIT_BUG)


@contextmanager
def storage(table: str, uri: str, *, write: bool = False) -> Iterator[None]:
    """Storage faults inside the block become one error naming ``table`` and what to do."""
    try:
        yield
    except STORAGE_ERRORS as exc:
        error = unwritable_error if write else unreadable_error
        raise error(exc, table=table, uri=uri) from exc


def open_queue(lake_root: str, name: str) -> Queue:
    """A queue whose log and files are whole (else one error naming the table and file)."""
    return open_checked(open_lake(lake_root), name)


@click.group(cls=CuesGroup)
def main() -> None:
    """cues_platform: exactly-once stream processing on Delta Lake queues."""


@main.command()
@click.option(
    "--lake", "lake_root", default=None,
    help="Lake root (recreated). Default: the lake the Dagster UI serves ($CUES_LAKE or ./lake) with "
         "--engine dagster, .cues/demo-lake with --engine runner.")
@click.option("--messages", type=int, default=None,
              help="Postings to generate (default 3,000; with --queues: 100,000 messages).")
@click.option("--seed", default=7, show_default=True, help="Traffic seed (the same seed, the same traffic).")
@click.option("--rate", default=0.03, show_default=True,
              help="Postings per second of traffic time (3,000 at 0.03/s: about 28 hours, two value dates).")
@click.option("--batch-size", default=1_000, show_default=True, help="Processor batch size.")
@click.option("--engine", type=click.Choice(["dagster", "runner"]), default="dagster", show_default=True,
              help="dagster: the deployment's job payments__all as Dagster runs on the project's instance "
                   "($DAGSTER_HOME or ./dagster_home), shown by `dagster dev` afterwards; runner: the graph "
                   "runner alone (faster, records no Dagster run; --batch-size applies to it only).")
@click.option("--keep-postgres", is_flag=True,
              help="Leave the embedded PostgreSQL running afterwards (default: stop it if the demo started it).")
@click.option("--queues", "queues_only", is_flag=True, help="The earlier queue-layer demo instead.")
def demo(lake_root: str | None, messages: int | None, seed: int, rate: float, batch_size: int, engine: str,
         keep_postgres: bool, queues_only: bool) -> None:
    """The main job: the reference payments pipeline end to end on embedded defaults.

    Generates realistic traffic (malformed rows, duplicate ids, contract breaks, late data,
    producer resends), processes it with every processor kind exactly once on Spark, books the
    ledger in PostgreSQL (embedded unless $CUES_POSTGRES_DSN is set), reconciles every posting,
    audits the lake and prints a summary. Exit code 1 if reconciliation or the audit fails.
    """
    if queues_only:
        from cues_platform.demo import run_demo

        ok = run_demo(lake_root=lake_root or ".cues/demo-lake", messages=messages or 100_000, console=console)
        sys.exit(0 if ok else 1)
    if engine == "dagster":
        # the deployment's code location reads $CUES_LAKE when it loads: point it at this lake
        lake_root = lake_root or os.environ.get("CUES_LAKE") or "lake"
        os.environ["CUES_LAKE"] = lake_root
    else:
        lake_root = lake_root or ".cues/demo-lake"
    from pathlib import Path

    from cues_platform.pgserver_db import DSN_ENV, embedded_postgres, stop_embedded_postgres
    from cues_platform.reference.generator import TrafficSpec
    from cues_platform.reference.job import DEFAULT_PG_DIR, run_reference
    from cues_platform.reference.ledger import DEFAULT_SCHEMA, LedgerDB

    external = os.environ.get(DSN_ENV, "").strip()
    pg_dir = Path(DEFAULT_PG_DIR)
    # the deployment's ledger resource books into DEFAULT_SCHEMA (resources/postgres.py)
    schema = DEFAULT_SCHEMA if engine == "dagster" else "cues_demo"
    started_pg = False
    if external:
        db = LedgerDB(external, schema=schema)  # the DSN may hold a password: never printed
    else:
        import warnings

        with warnings.catch_warnings():  # platformdirs warns at import when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(pg_dir.resolve()) if pg_dir.exists() else None
        started_pg = info is None or not info.is_running()
        with console.status(f"starting the embedded PostgreSQL ({pg_dir}) ..."):
            db = LedgerDB(embedded_postgres(pg_dir), schema=schema)
    try:
        spec = TrafficSpec(messages=messages or 3_000, seed=seed, rate=rate)
        summary = run_reference(lake_root=lake_root, spec=spec, console=console, ledger=db,
                                batch_size=batch_size, engine=engine)
    finally:
        if started_pg and not keep_postgres:
            stop_embedded_postgres(pg_dir)
    sys.exit(0 if summary.ok else 1)


@main.group()
def queue() -> None:
    """Inspect queues."""


@queue.command("ls")
@lake_option
def queue_ls(lake_root: str) -> None:
    """List the queues of a lake with their partitions and sizes."""
    lake = open_lake(lake_root)
    table = Table("queue", "partitions", "messages", "next offsets", "version")
    problems = []
    for name in queue_folders(lake):
        try:
            q = open_checked(lake, name)
            with storage(name, q.uri):
                ends = q.end_offsets()
                row = (name, ",".join(q.partitions), str(q.count()),
                       " ".join(f"{p}:{e}" for p, e in ends.items()), str(q.version()))
        except CuesError as exc:  # one damaged queue must not hide the others
            problems.append(str(exc))
            continue
        table.add_row(*row)
    console.print(table)
    if problems:
        for message in problems:
            click.echo(f"error: {' '.join(message.split())}", err=True)
        sys.exit(EXIT_BAD_INPUT)


@queue.command("show")
@click.argument("name")
@lake_option
def queue_show(name: str, lake_root: str) -> None:
    """Schema, partitions, offsets and files of one queue."""
    q = open_queue(lake_root, name)
    with storage(name, q.uri):
        _show(name, q)


def _show(name: str, q: Queue) -> None:
    console.print(f"[bold]{name}[/] at {q.uri} (Delta version {q.version()})")
    console.print("payload schema:")
    for field in q.payload_schema:
        console.print(f"  {field.name}: {field.type}{'' if field.nullable else ' not null'}")
    from cues_platform.queues.retention import policy_of

    click.echo(f"retention: {policy_of(q).describe()}")
    table = Table("partition", "messages", "start offset", "last offset", "files")
    for p in q.partitions:
        files = q.files(partition=p)
        last = q.last_offset(p)
        table.add_row(p, str(sum(f.rows for f in files)), str(q.start_offset(p)),
                      "-" if last is None else str(last), str(len(files)))
    console.print(table)


@queue.command("tail")
@click.argument("name")
@click.option("--partition", "-p", default=None, help="Partition (default: the first).")
@click.option("-n", "count", default=10, show_default=True, help="How many of the newest messages.")
@click.option(
    "--isolation",
    type=click.Choice(["read_committed", "read_uncommitted"]),
    default="read_committed",
)
@lake_option
def queue_tail(
    name: str, partition: str | None, count: int, isolation: str, lake_root: str
) -> None:
    """Print the newest messages of a partition."""
    q = open_queue(lake_root, name)
    part = partition or q.partitions[0]
    with storage(name, q.uri):
        end = q.next_offset(q.check_partition(part))
        rows = q.read_arrow(partition=part, start=max(q.start_offset(part), end - count),
                            isolation=isolation)
    table = Table(*rows.column_names)
    for row in rows.to_pylist():
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)


@queue.command("maintain")
@click.argument("name")
@click.option("--retention-hours", default=24.0, show_default=True,
              help="Keep removed files this long (fractions round up to whole hours; < 1 h refused).")
@click.option("--unsafe-allow-short-retention", is_flag=True,
              help="Allow a retention under 1 h (a slow reader may lose files it is reading).")
@lake_option
def queue_maintain(name: str, retention_hours: float, unsafe_allow_short_retention: bool,
                   lake_root: str) -> None:
    """Apply the queue's retention, then compact, checkpoint and vacuum it (transactions past
    their timeout are aborted first; a processor's home has its step records digested first, so
    dropping old log entries loses none); then compact the lake's positions and transaction
    tables."""
    from cues_platform.processing.retention import maintain_queue, maintain_system_tables

    q = open_queue(lake_root, name)
    with storage(name, q.uri, write=True):
        retained, reports = maintain_queue(
            q, retention_hours=retention_hours,
            unsafe_allow_short_retention=unsafe_allow_short_retention)
        system = maintain_system_tables(q.lake, retention_hours=retention_hours,
                                        unsafe_allow_short_retention=unsafe_allow_short_retention)
    for line in retained.lines():
        click.echo(line)
    for report in reports:
        console.print(report)
    for table, merged in system.items():
        click.echo(f"system table {table}: {merged} small file(s) compacted")


@queue.command("retention")
@click.argument("name")
@click.option("--ms", "ms", type=click.IntRange(min=0), default=None,
              help="Keep messages this many milliseconds (Kafka's retention.ms).")
@click.option("--hours", type=click.FloatRange(min=0), default=None, help="The same, in hours.")
@click.option("--days", type=click.FloatRange(min=0), default=None, help="The same, in days.")
@click.option("--bytes", "max_bytes", type=click.IntRange(min=0), default=None,
              help="Keep at most this many bytes of files per partition (Kafka's retention.bytes).")
@click.option("--keep-all", is_flag=True, help="Remove both limits: keep every message.")
@lake_option
def queue_retention(name: str, ms: int | None, hours: float | None, days: float | None,
                    max_bytes: int | None, keep_all: bool, lake_root: str) -> None:
    """Show or set a queue's retention. Retention never removes a message a processor lane, a
    tailer that is not expendable, or an open transaction still needs; `cues queue maintain`
    applies it."""
    from cues_platform.queues.retention import policy_of, set_policy

    ages = [v for v in (ms, hours, days) if v is not None]
    if len(ages) > 1:
        raise click.UsageError("give the age once: --ms, --hours or --days")
    if keep_all and (ages or max_bytes is not None):
        raise click.UsageError("--keep-all removes both limits; give it alone")
    q = open_queue(lake_root, name)
    with storage(name, q.uri, write=keep_all or bool(ages) or max_bytes is not None):
        policy = policy_of(q)
        if keep_all:
            policy = set_policy(q, ms=None, bytes=None)
        elif ages or max_bytes is not None:
            age = (ms if ms is not None else round(hours * 3_600_000) if hours is not None
                   else round(days * 86_400_000) if days is not None else policy.ms)
            policy = set_policy(q, ms=age, bytes=max_bytes if max_bytes is not None
                                else policy.bytes)
        starts = q.start_offsets()
    click.echo(f"{name}: {policy.describe()}")
    click.echo("start offsets: " + " ".join(f"{p}:{o}" for p, o in starts.items()))


# -- exactly-once processing ------------------------------------------------------------------------
@main.command("audit")
@lake_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--graph",
    "graph_ref",
    default=None,
    metavar="GRAPH",
    help="Optional graph (module:attr or file.py:attr) for topology cross-checks.",
)
def audit_command(lake_root: str, as_json: bool, graph_ref: str | None) -> None:
    """Check exactly-once delivery of every processor; exit 0 when clean, 1 on any violation."""
    from cues_platform.audit import audit

    graph = None
    if graph_ref is not None:
        from cues_platform.processing.loader import load_graph

        graph = load_graph(graph_ref)
    report = audit(Lake(root=lake_root), graph=graph)
    click.echo(report.to_json() if as_json else report.to_text(max_per_kind=None))
    exit_with(0 if report.ok else 1)  # os._exit after a flush: no teardown crash (audit/exit.py)


@main.group()
def backing() -> None:
    """Inspect processors' backing queues."""


@backing.command("show")
@click.argument("processor")
@lake_option
@click.option(
    "-n", "count", default=20, show_default=True, help="How many of the last steps (0: all)."
)
def backing_show(processor: str, lake_root: str, count: int) -> None:
    """A processor's backing queue in words: each step's snapshot and attempt."""
    from cues_platform.audit import describe_backing

    for line in describe_backing(Lake(root=lake_root), processor, last=count or None):
        click.echo(line)


@main.group("graph")
def graph_group() -> None:
    """Inspect graphs."""


@graph_group.command("show")
@click.argument("graph_ref", metavar="GRAPH")
def graph_show(graph_ref: str) -> None:
    """Print a graph (module:attr or file.py:attr) as a Mermaid flowchart."""
    from cues_platform.processing.loader import load_graph

    click.echo(load_graph(graph_ref).mermaid())


@main.command("run")
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
    import logging
    import threading
    import time

    from cues_platform.processing.errors import PlatformStepError
    from cues_platform.processing.events import RunnerStatus
    from cues_platform.processing.failures import Origin, Phase, origin_of
    from cues_platform.processing.loader import load_graph
    from cues_platform.processing.runner import GraphRunner
    from cues_platform.signals import StopSignals
    from cues_platform.spark import get_spark

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


main.add_command(participant)  # cues participant ... (the postings protocol, seed 002)
main.add_command(__import__("cues_platform.jepsen.cli", fromlist=["jepsen"]).jepsen)  # cues jepsen
main.add_command(__import__("cues_platform.spark.cli", fromlist=["spark"]).spark)  # cues spark
main.add_command(__import__("cues_platform.commands.processor", fromlist=["processor"]).processor)  # cues processor
main.add_command(__import__("cues_platform.commands.txn", fromlist=["txn"]).txn)  # cues txn

if __name__ == "__main__":
    main()
