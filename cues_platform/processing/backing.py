"""The backing queue: a processor's hidden log of snapshots and attempts (seed 004).

It is itself a cues queue (one partition, dense offsets) at ``{lake}/_cues/backing/{processor}``,
so the last record is one O(1) read: offset ``next - 1``, found through file statistics.
Every append carries the app transaction ``epoch``; a new instance of the processor commits a
higher epoch (with an empty commit: no record), after which an older instance's appends fail
their epoch check or conflict, so the backing queue has one writer at a time.

Keeping recovery O(1) as steps pile up: every step adds two commits and two files, and Delta's
own per-table costs (the fence commit, opening the log) grow with both. Nothing ever reads an
old version of a backing queue (recovery and the auditor read the latest snapshot), so its log
and tombstones are kept for ``BACKING_RETENTION`` only, and the stepper compacts, checkpoints
and trims it every ``Options.backing_maintenance_every`` steps (:meth:`BackingQueue.maintain`).
Files of replaced snapshots are vacuumed after the default vacuum retention (24 h), so a reader
holding an older snapshot never loses a file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from cues_platform.processing.errors import ProcessorFencedError
from cues_platform.queues import Lake, Queue, maintenance
from cues_platform.queues.appender import append_batches
from cues_platform.queues.layout import BACKING_EPOCH, COMMIT_HOOKS

BACKING_RETENTION = "interval 1 hours"
BACKING_ROW_GROUP_ROWS = 1_024  # recovery decodes one group to read the last record
BACKING_PROPERTIES = {"delta.logRetentionDuration": BACKING_RETENTION,
                      "delta.deletedFileRetentionDuration": BACKING_RETENTION}
SCHEMA = pa.schema([
    pa.field("type", pa.string(), nullable=False),
    pa.field("step", pa.int64(), nullable=False),
    pa.field("epoch", pa.int64(), nullable=False),
    pa.field("hash", pa.string(), nullable=False),
    pa.field("snapshot", pa.string(), nullable=False),
    pa.field("outputs", pa.string(), nullable=True),
    pa.field("error", pa.string(), nullable=True),
])


class RecordType(StrEnum):
    SNAPSHOT = "snapshot"
    ATTEMPT_OUTPUT = "attempt_output"
    ATTEMPT_ERROR = "attempt_error"
    ATTEMPT_NIL = "attempt_nil"
    # A digest of one-commit steps already delivered (their records copied from the home queue's
    # log, which Delta trims after its retention): written at backing maintenance, expanded back
    # into one attempt per step by ``expand``. Its own snapshot is that of its last step.
    DIGEST = "steps_digest"


@dataclass(frozen=True)
class Range:
    queue: str
    partition: str
    start: int
    end: int  # exclusive

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ErrorRef:
    """One row of an error queue: what a replay step re-feeds (``processing/replay.py``)."""

    queue: str
    partition: str
    offset: int

    def __str__(self) -> str:
        return f"{self.queue}/{self.partition}@{self.offset}"


@dataclass(frozen=True)
class Snapshot:
    """The input ranges of one step (and, for alts, the binding it reads). A *replay step*
    (``replay`` set) re-reads the ranges of that error row on purpose: its ranges are old, the
    lane's positions do not move."""

    processor: str
    step: int
    inputs: Mapping[str, Range]
    alts: str | None = None
    replay: ErrorRef | None = None

    def canonical(self) -> bytes:
        body: dict[str, Any] = {
            "processor": self.processor, "step": self.step, "alts": self.alts,
            "inputs": {b: [r.queue, r.partition, r.start, r.end] for b, r in sorted(self.inputs.items())}}
        if self.replay is not None:  # absent otherwise: every other hash is unchanged
            body["replay"] = [self.replay.queue, self.replay.partition, self.replay.offset]
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @property
    def delivery_hash(self) -> str:
        """128-bit BLAKE2b of the canonical encoding: the same on every retry of the step."""
        return hashlib.blake2b(self.canonical(), digest_size=16).hexdigest()

    def to_json(self) -> str:
        return self.canonical().decode()

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        body = json.loads(text)
        replay = body.get("replay")
        return cls(processor=body["processor"], step=body["step"], alts=body["alts"],
                   inputs={b: Range(*v) for b, v in body["inputs"].items()},
                   replay=None if replay is None else ErrorRef(*replay))

    @property
    def rows(self) -> int:
        return sum(r.size for r in self.inputs.values())


@dataclass(frozen=True)
class Record:
    type: RecordType
    snapshot: Snapshot
    epoch: int
    outputs: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    offset: int = -1  # the backing offset; -1 for a record read back from a home commit
    version: int | None = None  # the home commit's Delta version (one-commit steps)

    @property
    def step(self) -> int:
        return self.snapshot.step

    @property
    def hash(self) -> str:
        return self.snapshot.delivery_hash

    @property
    def is_attempt(self) -> bool:
        return self.type is not RecordType.SNAPSHOT


def _row(record: Record) -> dict[str, list[Any]]:
    return {"type": [record.type.value], "step": [record.step], "epoch": [record.epoch],
            "hash": [record.hash], "snapshot": [record.snapshot.to_json()],
            "outputs": [json.dumps(record.outputs, sort_keys=True) if record.outputs else None],
            "error": [record.error]}


def digest(records: list[Record], epoch: int) -> Record:
    """One backing record holding ``records`` (one-commit steps, in step order)."""
    body = [{"type": r.type.value, "snapshot": r.snapshot.to_json(), "epoch": r.epoch,
             "outputs": dict(r.outputs), "error": r.error, "version": r.version} for r in records]
    return Record(RecordType.DIGEST, records[-1].snapshot, epoch, {"steps": body})


def expand(record: Record) -> list[Record]:
    """A digest as the attempts it holds (``offset`` that of the digest); any other record as is.
    Raises KeyError/TypeError/ValueError on a malformed digest."""
    if record.type is not RecordType.DIGEST:
        return [record]
    return [Record(RecordType(d["type"]), Snapshot.from_json(d["snapshot"]), int(d["epoch"]),
                   d.get("outputs") or {}, d.get("error"), record.offset, d.get("version"))
            for d in record.outputs["steps"]]


def _from_row(row: Mapping[str, Any]) -> Record:
    return Record(type=RecordType(row["type"]), snapshot=Snapshot.from_json(row["snapshot"]),
                  epoch=row["epoch"], outputs=json.loads(row["outputs"]) if row["outputs"] else {},
                  error=row["error"], offset=row["_offset"])


class BackingQueue:
    def __init__(self, lake: Lake, processor_id: str) -> None:
        self.processor_id = processor_id
        self.queue: Queue = lake.create_queue(
            processor_id, schema=SCHEMA, partitions=("0",), exist_ok=True,
            uri=lake.system_uri("backing", processor_id), properties=BACKING_PROPERTIES,
            description=f"backing queue of processor {processor_id}")

    def epoch(self, dt: DeltaTable | None = None) -> int:
        version = (dt or self.queue.refresh()).transaction_version(BACKING_EPOCH.id())
        return -1 if version is None else int(version)

    def fence(self, *, minimum: int = 0) -> int:
        """Start a new epoch, at least ``minimum`` (fencing every older instance), and return it."""
        for _ in range(200):
            try:
                with self.queue.writing() as dt:  # read and commit on one unmoved snapshot
                    new = max(self.epoch(dt) + 1, minimum)
                    write_deltalake(dt, self.queue.table_schema.empty_table(), mode="append",
                                    commit_properties=CommitProperties(
                                        app_transactions=[Transaction(BACKING_EPOCH.id(), new)],
                                        custom_metadata={"cues.epoch": str(new)}),
                                    post_commithook_properties=COMMIT_HOOKS)
                return new
            except CommitFailedError:
                continue
        raise ProcessorFencedError(f"processor {self.processor_id!r}: could not start a new epoch; "
                                   "another instance keeps starting", processor=self.processor_id)

    def append(self, record: Record) -> Record:
        def guard(dt: DeltaTable) -> None:
            current = self.epoch(dt)
            if current != record.epoch:
                raise ProcessorFencedError(
                    f"processor {self.processor_id!r}: epoch {record.epoch} was fenced by a newer "
                    f"instance (epoch {current}); this instance stops without delivering step {record.step}",
                    processor=self.processor_id, epoch=record.epoch, newest=current, step=record.step)

        result = append_batches(self.queue, {"0": _row(record)}, guards=[guard],
                                app_transactions=[(BACKING_EPOCH.id(), record.epoch)],
                                message_type=record.type.value, delivery_hash=record.hash,
                                commit_metadata={"cues.step": str(record.step)})
        return Record(record.type, record.snapshot, record.epoch, record.outputs, record.error,
                      result.first_offset)


    def maintain(self) -> None:
        """Compact the records into few files, checkpoint, drop log entries and tombstones older
        than ``BACKING_RETENTION``, vacuum files unreferenced for 24 h. Changes no record."""
        maintenance.maintain(self.queue, row_group_rows=BACKING_ROW_GROUP_ROWS)

    def last_record(self) -> Record | None:
        """The newest record, read in O(1) whatever the history's length. A digest comes back with
        its type, epoch and last snapshot but not the steps it holds (up to
        ``backing_maintenance_every`` of them, which recovery and status never need: decoding
        them was a third of a recovery's time; :meth:`records` expands them)."""
        last = self.queue.last_offset("0")
        if last is None:
            return None
        row = self.queue.read_arrow(partition="0", start=last, end=last + 1).to_pylist()[0]
        if row["type"] == RecordType.DIGEST.value:
            row["outputs"] = None
        return _from_row(row)

    def records(self, *, start: int = 0) -> list[Record]:
        """Every record from ``start``, digests expanded into their steps' attempts."""
        rows = self.queue.read_arrow(partition="0", start=start).to_pylist()
        return [r for row in rows for r in expand(_from_row(row))]

    def digested_version(self) -> int:
        """The newest home-queue version that a digest holds (-1: none)."""
        rows = self.queue.read_arrow(partition="0", columns=["type", "outputs"]).to_pylist()
        versions = [d.get("version") or -1 for row in rows if row["type"] == RecordType.DIGEST.value
                    for d in json.loads(row["outputs"])["steps"]]
        return max(versions, default=-1)


BackingOf = Callable[[str], BackingQueue]
"""Where a step reaches a processor's backing queue, by processor (lane) id: the Dagster ``backing``
resource's :meth:`~cues_platform.dagster.resources.BackingQueueResource.backing`, or
:func:`open_backing` under ``cues run``."""


def open_backing(lake: Lake) -> BackingOf:
    """The backing queues of ``lake``, one handle per call (``cues run`` and tests)."""
    return lambda processor_id: BackingQueue(lake, processor_id)
