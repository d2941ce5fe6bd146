"""The ``cues`` command (click, Dagster's own CLI library)."""

from __future__ import annotations

import os
import sys

import click
from rich.console import Console
from rich.table import Table

from cues_platform.errors import CuesError
from cues_platform.queues import Lake

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
    """Turns every CuesError into one clear line and exit code 2 (1 for audit failures)."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except CuesError as exc:
            console.print(f"[bold red]error:[/] {exc}")
            sys.exit(2)


@click.group(cls=CuesGroup)
def main() -> None:
    """cues_platform: exactly-once stream processing on Delta Lake queues."""


@main.command()
@click.option(
    "--lake", "lake_root", default=".cues/demo-lake", show_default=True, help="Lake root."
)
@click.option("--messages", default=100_000, show_default=True, help="Messages to produce.")
def demo(lake_root: str, messages: int) -> None:
    """The main job: produce, resend, transact, tail with Spark, maintain, and check the queues."""
    from cues_platform.demo import run_demo

    ok = run_demo(lake_root=lake_root, messages=messages, console=console)
    sys.exit(0 if ok else 1)


@main.group()
def queue() -> None:
    """Inspect queues."""


@queue.command("ls")
@lake_option
def queue_ls(lake_root: str) -> None:
    """List the queues of a lake with their partitions and sizes."""
    lake = Lake(root=lake_root)
    table = Table("queue", "partitions", "messages", "next offsets", "version")
    for name in lake.list_queues():
        q = lake.queue(name)
        ends = q.end_offsets()
        table.add_row(
            name,
            ",".join(q.partitions),
            str(q.count()),
            " ".join(f"{p}:{e}" for p, e in ends.items()),
            str(q.version()),
        )
    console.print(table)


@queue.command("show")
@click.argument("name")
@lake_option
def queue_show(name: str, lake_root: str) -> None:
    """Schema, partitions, offsets and files of one queue."""
    q = Lake(root=lake_root).queue(name)
    console.print(f"[bold]{name}[/] at {q.uri} (Delta version {q.version()})")
    console.print("payload schema:")
    for field in q.payload_schema:
        console.print(f"  {field.name}: {field.type}{'' if field.nullable else ' not null'}")
    table = Table("partition", "messages", "last offset", "files")
    for p in q.partitions:
        files = q.files(partition=p)
        last = q.last_offset(p)
        table.add_row(
            p, str(sum(f.rows for f in files)), "-" if last is None else str(last), str(len(files))
        )
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
    q = Lake(root=lake_root).queue(name)
    part = partition or q.partitions[0]
    end = q.next_offset(q.check_partition(part))
    rows = q.read_arrow(partition=part, start=max(0, end - count), isolation=isolation)
    table = Table(*rows.column_names)
    for row in rows.to_pylist():
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)


@queue.command("maintain")
@click.argument("name")
@click.option("--retention-hours", default=24.0, show_default=True)
@lake_option
def queue_maintain(name: str, retention_hours: float, lake_root: str) -> None:
    """Compact, checkpoint and vacuum one queue."""
    from cues_platform.queues.maintenance import maintain

    for report in maintain(Lake(root=lake_root).queue(name), retention_hours=retention_hours):
        console.print(report)


if __name__ == "__main__":
    main()
