"""``cues errors list``: the rows of an error queue, one per failing input row, in words.

Each error row names the processor, its step, the input row it failed on (``queue/partition@offset``
when the step isolated it: ``processing/isolation.py``; the step's ranges otherwise), the
exception's class and first line, and the input row itself as JSON. ``--json`` prints one JSON
object per line instead (every column, the parsed inputs included), for scripts.
``cues_platform/cli/root.py`` adds this group to ``cues``.
"""

from __future__ import annotations

import json

import click
import pyarrow as pa

from cues_platform.cli.common import lake_option, open_queue
from cues_platform.errors import ConfigurationError
from cues_platform.processing.outputs import ERROR_SCHEMA
from cues_platform.queues.schema import OFFSET, PARTITION

NEEDED = ("processor", "step", "inputs", "exception_type", "message", "payload")


def inputs_in_words(inputs: str) -> str:
    """``a/0@13`` for a one-offset range, ``a/0[10, 20)`` for a step's range; bindings joined."""
    parts = []
    for queue, partition, start, end in json.loads(inputs).values():
        if end - start == 1:
            parts.append(f"{queue}/{partition}@{start}")
        elif end > start:
            parts.append(f"{queue}/{partition}[{start}, {end})")
    return ", ".join(parts) or "-"


def _short(text: str | None, width: int) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


@click.group("errors")
def errors_group() -> None:
    """Error queues: the input rows processors failed on."""


@errors_group.command("list")
@click.argument("queue", default="errors")
@click.option("--processor", "processor", default=None, help="Only the rows of this processor.")
@click.option("-n", "count", default=50, show_default=True, help="How many of the newest rows (0: all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line, every column.")
@lake_option
def errors_list(queue: str, processor: str | None, count: int, as_json: bool, lake_root: str) -> None:
    """The newest error rows of QUEUE (default ``errors``): processor, step, the input row it
    failed on, the exception and the row itself."""
    if count < 0:
        raise ConfigurationError(f"-n {count}: give how many rows to show (0: all)", count=count)
    q = open_queue(lake_root, queue)
    missing = [c for c in NEEDED if c not in q.table_schema.names]
    if missing:
        raise ConfigurationError(
            f"queue {queue!r} is not an error queue (it has no {', '.join(missing)} column); "
            "name the queue your graph's error_queue writes (default: errors)", queue=queue)
    tables = [q.read_arrow(partition=part) for part in q.partitions]
    rows = _rows(pa.concat_tables(tables) if tables else ERROR_SCHEMA.empty_table(), processor=processor,
                 count=count)
    if as_json:
        for row in rows:
            row["inputs"] = json.loads(row["inputs"])
            click.echo(json.dumps(row, default=str, sort_keys=True))
        return
    if not rows:
        click.echo(f"{queue}: no error rows" + (f" of processor {processor!r}" if processor else ""))
        return
    for row in rows:  # one line per row: greppable, never wrapped
        click.echo(f"{queue}/{row[PARTITION]}@{row[OFFSET]}  {row['processor']} step {row['step']}  "
                   f"failed on {inputs_in_words(row['inputs'])}  "
                   f"{headline(row['exception_type'], row['message'])}  row {row['payload'] or '-'}")


def headline(exception_type: str, message: str | None) -> str:
    """``Class: message`` in one line; for a UDF that raised on an executor, the user's own line
    from the worker's traceback (the message's first line is Spark's)."""
    short = exception_type.rsplit(".", 1)[-1]
    lines = (message or "").strip().splitlines()
    for line in reversed(lines):
        if f"{short}: " in line:
            return _short(f"{short}: " + line.split(f"{short}: ", 1)[1], 160)
    return _short(f"{short}: {lines[0] if lines else ''}", 160)


def _rows(table: pa.Table, *, processor: str | None, count: int) -> list[dict]:
    rows = [r for r in table.to_pylist() if processor is None or r["processor"] == processor]
    rows.sort(key=lambda r: (r[PARTITION], r[OFFSET]))
    return rows[-count:] if count else rows


__all__ = ["errors_group", "headline", "inputs_in_words"]
