"""Reading a processor's backing queue: its records parsed (malformed ones are violations of
step 4), the attempt's output map, and what the audit knows about each delivery hash."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from cues_platform.audit.discovery import open_backing
from cues_platform.audit.report import MALFORMED_RECORD, Violation
from cues_platform.processing.backing import Record, RecordType, Snapshot, expand
from cues_platform.queues import Lake, Queue
from cues_platform.queues.retention import start_offset
from cues_platform.queues.schema import OFFSET


@dataclass
class Backing:
    processor: str
    queue: Queue
    records: list[Record]
    cut: int  # next offset at the time of the read
    epoch: int
    violations: list[Violation]
    start: int = 0  # the backing queue's start offset: records below it were retained away


def parse_records(processor: str, table: pa.Table) -> tuple[list[Record], list[Violation]]:
    records, bad = [], []
    for row in table.to_pylist():
        try:
            snapshot = Snapshot.from_json(row["snapshot"])
            record = Record(
                type=RecordType(row["type"]),
                snapshot=snapshot,
                epoch=row["epoch"],
                outputs=json.loads(row["outputs"]) if row["outputs"] else {},
                error=row["error"],
                offset=row[OFFSET],
            )
            problems = []
            if snapshot.processor != processor:
                problems.append(f"its snapshot names processor {snapshot.processor!r}")
            if record.step != row["step"] or record.hash != row["hash"]:
                problems.append("its step/hash columns disagree with its snapshot")
            if not isinstance(record.outputs, Mapping):
                problems.append("its outputs are not a JSON object")
            expanded = expand(record)  # a digest of one-commit steps: one attempt per step
            if any(r.snapshot.processor != processor for r in expanded):
                problems.append("its digest holds a step of another processor")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            problems = [f"it does not parse ({type(exc).__name__}: {exc})"]
        if problems:
            bad.append(
                Violation(
                    MALFORMED_RECORD,
                    f"backing record at offset {row[OFFSET]} of processor {processor!r}: "
                    + "; ".join(problems),
                    processor=processor,
                    step=row.get("step"),
                    hash=row.get("hash"),
                )
            )
            continue
        records.extend(expanded)
    return records, bad


def read_backing(lake: Lake, processor: str, queue: Queue | None = None) -> Backing:
    queue = queue or open_backing(lake, processor)
    dt = queue.refresh()
    cut = queue.next_offset("0", snapshot=dt)
    version = dt.transaction_version("epoch")
    start = start_offset(queue, "0", snapshot=dt)  # records below it were retained away
    table = queue.read_arrow(partition="0", start=start, end=cut)
    records, bad = parse_records(processor, table)
    return Backing(processor, queue, records, cut, -1 if version is None else int(version), bad,
                   start)


def record_rows(record: Record) -> dict[str, dict[str, int]]:
    """``{queue: {partition: rows}}`` of an attempt (the ``rows`` map, else the ``files`` map)."""
    rows = record.outputs.get("rows") or {}
    out: dict[str, dict[str, int]] = {
        q: {p: int(n) for p, n in parts.items()} for q, parts in rows.items()
    }
    for q, parts in (record.outputs.get("files") or {}).items():
        for p in parts:
            out.setdefault(q, {}).setdefault(p, -1)  # -1: a staged file without a recorded count
    return out


def outcome_of(record: Record) -> str:
    return {RecordType.ATTEMPT_OUTPUT: "output", RecordType.ATTEMPT_ERROR: "error"}.get(
        record.type, "nil"
    )


@dataclass(frozen=True)
class Known:
    """A delivery hash the audit knows: the attempt that recorded it."""

    processor: str
    record: Record


def names(rows: Mapping[str, Mapping[str, int]]) -> str:
    return (
        ", ".join(f"{q}/{p}" for q, parts in sorted(rows.items()) for p in sorted(parts))
        or "nothing"
    )
