"""Quarantine: the operator's way to handle rows a ``contract`` or ``outside_protocol`` check
holds open (``cues quarantine`` is its command line: ``cues_platform/cli/quarantine.py``).

A queue is append-only: a row that broke its contract, or that was appended without a delivery
hash, stays where it is, and processors downstream read it like any row (they did already, or
will). Quarantining rows copies them into the graph's error queue (partition ``0``, like the
contract breaks a step splits off): one error row per queue row with its payload as JSON,
``processor`` ``cues.quarantine``, ``inputs`` ``{"quarantined": [queue, partition, start, end]}``
and the operator's reason in ``message``; ``exception_type`` ``cues_platform.ContractViolation``
for a row with a delivery hash, ``cues_platform.OutsideProtocol`` for a row without one (it may
be a good row a trusted producer wrote: the error row is then the operator's acknowledgement,
with the reason, not a claim that it is broken). Rows the queue's retention removed already are
quarantined as one error row per removed range, without payload (an acknowledgement: there is
nothing left to copy). Both checks read these rows back and close the offsets they name; it never looks at who wrote them, so a quarantine is one append any tool can make
(``quarantine`` below; the same row written by hand counts the same).

Quarantining the same offsets again writes nothing (the offsets already quarantined are read
first), so a retried call is harmless.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from cues_platform.dagster.check_memory import Runs, normalize, subtract
from cues_platform.errors import CuesError
from cues_platform.processing.contracts import rows_as_json
from cues_platform.processing.failures import CONTRACT_EXCEPTION_TYPE
from cues_platform.processing.outputs import ERROR_SCHEMA
from cues_platform.queues import Lake
from cues_platform.queues.reader import read_present
from cues_platform.queues.schema import DELIVERY_HASH, OFFSET, RESERVED

QUARANTINE_PROCESSOR = "cues.quarantine"
OUTSIDE_PROTOCOL_EXCEPTION_TYPE = "cues_platform.OutsideProtocol"
QUARANTINED = "quarantined"
ERROR_PARTITION = "0"


class QuarantineError(CuesError, ValueError):
    """A quarantine that cannot be made as asked (no error queue, an unknown partition, an
    empty or inverted range). Carries ``queue``, ``partition``, ``start``, ``end``. Not retryable:
    the call must change."""

    retryable = False


def quarantined_runs(lake: Lake, *, error_queue: str, queue: str) -> Runs:
    """``{partition: [[start, end), ...]}``: the offsets of ``queue`` quarantined in
    ``error_queue``."""
    errors = lake.queue(error_queue)
    found: dict[str, list[list[int]]] = {}
    for part in errors.partitions:
        table = errors.read_arrow(partition=part, columns=["processor", "inputs", "queue"])
        table = table.filter(pc.and_(pc.equal(table["processor"], QUARANTINE_PROCESSOR),
                                     pc.equal(table["queue"], queue)))
        for text in table["inputs"].to_pylist():
            named = json.loads(text).get(QUARANTINED)
            if isinstance(named, list) and len(named) == 4 and named[0] == queue:
                found.setdefault(str(named[1]), []).append([int(named[2]), int(named[3])])
    return normalize(found)


def quarantine_records(lake: Lake, *, error_queue: str, queue: str) -> list[dict[str, object]]:
    """Every quarantine of ``queue`` in ``error_queue``, oldest first, neighbouring offsets of one
    call merged: ``partition``, ``start``, ``end``, ``rows``, ``exception_type``, ``message`` (the
    reason), ``failed_at`` (when), ``payload`` (False: an acknowledgement of removed rows)."""
    errors = lake.queue(error_queue)
    found: list[dict[str, object]] = []
    for part in errors.partitions:
        table = errors.read_arrow(partition=part, columns=["processor", "inputs", "queue", "exception_type",
                                                           "message", "failed_at", "payload"])
        table = table.filter(pc.and_(pc.equal(table["processor"], QUARANTINE_PROCESSOR),
                                     pc.equal(table["queue"], queue)))
        for row in table.to_pylist():
            named = json.loads(row["inputs"]).get(QUARANTINED)
            if not (isinstance(named, list) and len(named) == 4 and named[0] == queue):
                continue
            record = {"partition": str(named[1]), "start": int(named[2]), "end": int(named[3]),
                      "exception_type": row["exception_type"], "message": row["message"],
                      "failed_at": row["failed_at"], "payload": row["payload"] is not None}
            last = found[-1] if found else None
            if last is not None and all(last[k] == record[k] for k in ("partition", "exception_type", "message",
                                                                         "failed_at", "payload")) \
                    and last["end"] == record["start"]:
                last["end"] = record["end"]
            else:
                found.append(record)
    for record in found:
        record["rows"] = int(record["end"]) - int(record["start"])  # type: ignore[call-overload]
    return found


def quarantine(lake: Lake, *, error_queue: str, queue: str, partition: str, start: int, end: int,
               reason: str) -> int:
    """Copy the rows ``[start, end)`` of ``queue``/``partition`` into ``error_queue`` as
    quarantined (see the module docstring); returns how many error rows it wrote (0 when all were
    quarantined before)."""
    where = {"queue": queue, "partition": partition, "start": start, "end": end}
    if not error_queue:
        raise QuarantineError(
            f"cannot quarantine {queue}/{partition} [{start}, {end}): the graph has no error queue; "
            "declare one (Graph.build(error_queue=...)) or fix the contract so the rows pass", **where)
    source = lake.queue(queue)
    if partition not in source.partitions:
        raise QuarantineError(
            f"cannot quarantine {queue}/{partition}: the queue has no partition {partition!r} "
            f"(it has {list(source.partitions)})", **where)
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end):
        raise QuarantineError(
            f"cannot quarantine {queue}/{partition} [{start}, {end}): give offsets 0 <= start < end "
            "(half-open, as the check's open_failing lists them)", **where)
    end = min(end, source.next_offset(partition))
    todo = subtract({partition: [[start, end]]}, quarantined_runs(lake, error_queue=error_queue, queue=queue))
    if not todo:
        return 0
    payload = [c for c in source.payload_schema.names if c not in RESERVED]
    now = datetime.now(UTC)
    rows: dict[str, list] = {name: [] for name in ERROR_SCHEMA.names}

    def add(lo: int, hi: int, payload_json: str | None, *, hashed: bool = True) -> None:
        rows["processor"].append(QUARANTINE_PROCESSOR)
        rows["step"].append(lo)
        rows["inputs"].append(json.dumps({QUARANTINED: [queue, partition, lo, hi]}))
        rows["exception_type"].append(CONTRACT_EXCEPTION_TYPE if hashed else OUTSIDE_PROTOCOL_EXCEPTION_TYPE)
        rows["message"].append(
            f"quarantined by an operator (rows removed by retention, no payload): {reason}" if payload_json is None
            else f"quarantined by an operator: {reason}" if hashed
            else f"quarantined by an operator (written outside the protocol, no delivery hash): {reason}")
        rows["traceback"].append("")
        rows["failed_at"].append(now)
        rows["queue"].append(queue)
        rows["payload"].append(payload_json)

    for lo, hi in todo[partition]:
        # the rows one snapshot holds, and its start: a retention moving it meanwhile is no error
        table, first = read_present(source, partition=partition, start=lo, end=hi,
                                    call="quarantine")
        if lo < first:  # retention removed them: acknowledge the range, nothing to copy
            add(lo, min(hi, first), None)
        for offset, hashed, text in zip(table[OFFSET].to_pylist(), pc.is_valid(table[DELIVERY_HASH]).to_pylist(),
                                        rows_as_json(table.select(payload)), strict=True):
            add(int(offset), int(offset) + 1, text, hashed=bool(hashed))
    if not rows["processor"]:
        return 0
    lake.queue(error_queue).append(pa.table(rows, schema=ERROR_SCHEMA), partition=ERROR_PARTITION)
    return len(rows["processor"])


def quarantine_runs(lake: Lake, *, error_queue: str, queue: str, runs: Mapping[str, list[list[int]]],
                    reason: str) -> int:
    """:func:`quarantine` of every run of ``runs`` (e.g. a check's ``cues/open_failing``)."""
    return sum(quarantine(lake, error_queue=error_queue, queue=queue, partition=part, start=lo, end=hi,
                          reason=reason)
               for part, spans in normalize(runs).items() for lo, hi in spans)


__all__ = ["OUTSIDE_PROTOCOL_EXCEPTION_TYPE", "QUARANTINE_PROCESSOR", "QuarantineError", "quarantine",
           "quarantine_records", "quarantine_runs", "quarantined_runs"]
