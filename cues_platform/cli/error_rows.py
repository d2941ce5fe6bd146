"""``cues errors list``: the rows of an error queue, one per failing input row, in words.

Each error row names the processor, its step, the input row it failed on (``queue/partition@offset``
when the step isolated it: ``processing/isolation.py``; the step's ranges otherwise), the
exception's class and first line, and the input row itself as JSON. ``--json`` prints one JSON
object per line instead (every column, the parsed inputs included), for scripts.

``cues errors replay GRAPH --processor P [--where COND] [--dry-run]`` feeds the chosen error rows
of P back to it after the fix, exactly once (``processing/replay.py``): a row is replayed at most
once whatever the number of replays; rows that fail again become new error rows.
``cues_platform/cli/root.py`` adds this group to ``cues``.
"""

from __future__ import annotations

import json

import click
import pyarrow as pa
from rich.console import Console
from rich.progress import Progress

from cues_platform.cli.common import lake_option, open_queue
from cues_platform.errors import ConfigurationError
from cues_platform.processing.backing import BackingQueue, ErrorRef
from cues_platform.processing.discovery import backing_processors
from cues_platform.processing.error_words import headline, inputs_in_words
from cues_platform.processing.loader import load_graph
from cues_platform.processing.outputs import ERROR_SCHEMA
from cues_platform.processing.replay import ReplayIncompleteError, replay_errors, replayed_refs
from cues_platform.queues import Lake
from cues_platform.queues.schema import OFFSET, PARTITION
from cues_platform.spark import get_spark

NEEDED = ("processor", "step", "inputs", "exception_type", "message", "payload")


@click.group("errors")
def errors_group() -> None:
    """Error queues: the input rows processors failed on."""


@errors_group.command("list")
@click.argument("queue", default="errors")
@click.option("--processor", "processor", default=None, help="Only the rows of this processor.")
@click.option("-n", "count", default=50, show_default=True, help="How many of the newest rows (0: all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, every column.")
@click.option("--pending", is_flag=True, help="Only rows not replayed yet (`cues errors replay`).")
@lake_option
def errors_list(queue: str, processor: str | None, count: int, as_json: bool, pending: bool,
                lake_root: str) -> None:
    """The newest error rows of QUEUE (default ``errors``): processor, step, the input row it
    failed on, the exception and the row itself; ``[replayed]`` after a row a replay step fed
    back to its processor (the lane's replay log)."""
    if count < 0:
        raise ConfigurationError(f"-n {count}: give how many rows to show (0: all)", count=count)
    q = open_queue(lake_root, queue)
    missing = [c for c in NEEDED if c not in q.table_schema.names]
    if missing:
        raise ConfigurationError(
            f"queue {queue!r} is not an error queue (it has no {', '.join(missing)} column); "
            "name the queue your graph's error_queue writes (default: errors)", queue=queue)
    tables = [q.read_arrow(partition=part) for part in q.partitions]
    every = _rows(pa.concat_tables(tables) if tables else ERROR_SCHEMA.empty_table(), processor=processor,
                  count=0)
    done = _replayed(q.lake, {r["processor"] for r in every})
    for row in every:
        row["replayed"] = ErrorRef(queue, row[PARTITION], row[OFFSET]) in done
    rows = [r for r in every if not (pending and r["replayed"])]
    rows = rows[-count:] if count else rows
    if as_json:
        for row in rows:
            row["inputs"] = json.loads(row["inputs"])
            click.echo(json.dumps(row, default=str, sort_keys=True))
        return
    if not rows:
        click.echo(f"{queue}: no {'pending ' if pending else ''}error rows"
                   + (f" of processor {processor!r}" if processor else ""))
        return
    for row in rows:  # one line per row: greppable, never wrapped
        click.echo(f"{queue}/{row[PARTITION]}@{row[OFFSET]}  {row['processor']} step {row['step']}  "
                   f"failed on {inputs_in_words(row['inputs'])}  "
                   f"{headline(row['exception_type'], row['message'])}  row {row['payload'] or '-'}"
                   + ("  [replayed]" if row["replayed"] else ""))


def _replayed(lake: Lake, lanes: set[str]) -> set[ErrorRef]:
    """The replay logs of ``lanes`` that have a backing queue (read only: none is created)."""
    return {ref for lane in backing_processors(lake) if lane in lanes
            for ref in replayed_refs(BackingQueue(lake, lane))}


def _rows(table: pa.Table, *, processor: str | None, count: int) -> list[dict]:
    rows = [r for r in table.to_pylist() if processor is None or r["processor"] == processor]
    rows.sort(key=lambda r: (r[PARTITION], r[OFFSET]))
    return rows[-count:] if count else rows


@errors_group.command("replay")
@click.argument("graph_ref", metavar="GRAPH")
@click.option("--processor", "processor", required=True,
              help="The processor (as declared: every lane of it) whose error rows to replay.")
@click.option("--where", "where", default=None, metavar="COND",
              help="Only error rows matching this Spark SQL condition over the error queue's "
                   "columns, e.g. \"exception_type LIKE '%ValueError'\" or 'step >= 12'.")
@click.option("--dry-run", is_flag=True, help="Say what would be replayed; change nothing.")
@lake_option
def errors_replay(graph_ref: str, processor: str, where: str | None, dry_run: bool, lake_root: str) -> None:
    """Feed the error rows of PROCESSOR back to it (after fixing its code or data), exactly once.

    Each chosen row becomes one step of the processor's lane that reads the row's input again:
    its outputs are delivered once, a row failing again becomes a new error row, a row replayed
    before is skipped. The lane is fenced: an instance of it running elsewhere stops at its next
    commit (restart it after). Exit 2 after the others were replayed when some chosen rows could
    not be read again (removed by retention, or the processor no longer reads their partition)."""
    graph, lake = load_graph(graph_ref), Lake(root=lake_root)
    with Progress(transient=True, console=_stderr()) as bar:
        task = bar.add_task(f"replaying {processor}", total=None)
        report = replay_errors(graph=graph, processor=processor, lake=lake, spark=get_spark(),
                               where=where, dry_run=dry_run,
                               progress=lambda done, total: bar.update(task, completed=done, total=total))
    click.echo(report.summary())
    if report.unavailable:
        raise ReplayIncompleteError(
            f"{len(report.unavailable)} chosen error row(s) of {processor!r} were not replayed: "
            + "; ".join(report.unavailable[:5]), processor=processor, rows=len(report.unavailable))


def _stderr() -> Console:
    return Console(stderr=True)


__all__ = ["errors_group", "headline", "inputs_in_words"]
