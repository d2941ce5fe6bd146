"""``cues queue …``: list, show, tail, maintain and set the retention of a lake's queues."""

from __future__ import annotations

import sys

import click
from rich.table import Table

from cues_platform.audit.discovery import queue_folders
from cues_platform.audit.storage import open_checked
from cues_platform.cli.common import console, lake_option, open_lake, open_queue, storage
from cues_platform.errors import CuesError
from cues_platform.oneline import EXIT_BAD_INPUT
from cues_platform.processing.retention import maintain_queue, maintain_system_tables
from cues_platform.queues import Queue
from cues_platform.queues.reader import read_present
from cues_platform.queues.retention import policy_of, set_policy


@click.group()
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
    click.echo(f"retention: {policy_of(q).describe()}")
    click.echo(f"offsets: {q.offset_layout.value} (format {q.offset_layout.format_version})")
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
        # one snapshot: a retention moving the start meanwhile only leaves fewer rows to show
        rows, _ = read_present(q, partition=q.check_partition(part), start=0, newest=count,
                               isolation=isolation, call="cues queue tail")
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


__all__ = ["queue", "queue_maintain"]
