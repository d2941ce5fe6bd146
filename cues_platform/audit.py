"""The auditor: proves (or disproves) exactly-once delivery from what is in the lake.

Nothing but the lake is trusted: every exactly-once processor is found from its backing queue
(``{root}/_cues/backing/{processor}``), every output queue from the attempts that name it, and the
checks compare the backing records with the ``_delivery_hash`` / ``_partition`` / ``_offset``
columns of the queues (read as Arrow with column projection, vectorized: millions of rows are
fine). The checks (violation kinds in brackets):

1. Input coverage: every offset of every input partition, from 0 to the end of the processor's
   last delivered step, is read by exactly one delivered step ([gap], [overlap]); no step reads
   offsets the input does not have ([beyond_end]). A delivered step is an attempt whose commits
   are all present (rows with its hash in every queue it names); a nil attempt is delivered by
   its record. A trailing snapshot without an attempt, or a last attempt whose commits are not
   all there yet, is *pending* (recovery finishes it); input offsets after the last delivered step
   are *lag*. Neither is a violation.
2. Attribution: every row with a delivery hash in a queue that an exactly-once processor writes
   carries the hash of an attempt of some processor ([unknown_hash]) and lands in a queue and
   partition that attempt names ([unexpected_output]). Rows with a null hash (producers) are
   ignored; error rows that name a processor without a backing queue (at-least/at-most-once) are
   listed as not audited.
3. Once only: for each (queue, partition, hash) the rows equal the attempt's recorded count
   ([delivered_twice] when more, [row_count_mismatch] when fewer) and form one contiguous offset
   range ([not_contiguous]); an attempt followed by later steps has all its commits
   ([undelivered]); each queue's app transaction ``proc:{processor}`` agrees with the steps
   whose rows it holds ([app_transaction]).
4. The backing queue itself: steps numbered 0, 1, 2, ... each with one snapshot then one attempt
   of the same hash ([step_sequence]); records that do not parse ([malformed_record]); alts
   snapshots read only the chosen binding ([alts_not_empty]).

Reading is ordered so that a lake being written while it is audited gives no false alarm: the
backing queues are read first, then the queues; hashes of attempts appended in between are
recognized (from a second read of the backing tails) but their steps are left to the next audit.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cues_platform.errors import CuesError
from cues_platform.processing.backing import Range, Record, RecordType, Snapshot
from cues_platform.processing.graph import Graph, Strategy
from cues_platform.processing.outputs import proc_app_id
from cues_platform.queues import Lake, Queue
from cues_platform.queues.errors import QueueError
from cues_platform.queues.names import join_uri
from cues_platform.queues.schema import DELIVERY_HASH, MESSAGE_TYPE, OFFSET, PARTITION

__all__ = [
    "KINDS",
    "AuditError",
    "AuditReport",
    "InputLag",
    "LakeNotFoundError",
    "NoSuchProcessorError",
    "ProcessorSummary",
    "Violation",
    "audit",
    "backing_processors",
    "describe_backing",
]

GAP = "gap"
OVERLAP = "overlap"
BEYOND_END = "beyond_end"
UNKNOWN_HASH = "unknown_hash"
UNEXPECTED_OUTPUT = "unexpected_output"
DELIVERED_TWICE = "delivered_twice"
ROW_COUNT_MISMATCH = "row_count_mismatch"
NOT_CONTIGUOUS = "not_contiguous"
UNDELIVERED = "undelivered"
APP_TRANSACTION = "app_transaction"
STEP_SEQUENCE = "step_sequence"
MALFORMED_RECORD = "malformed_record"
ALTS_NOT_EMPTY = "alts_not_empty"
MISSING_QUEUE = "missing_queue"
KINDS = (
    GAP, OVERLAP, BEYOND_END, UNKNOWN_HASH, UNEXPECTED_OUTPUT, DELIVERED_TWICE,
    ROW_COUNT_MISMATCH, NOT_CONTIGUOUS, UNDELIVERED, APP_TRANSACTION, STEP_SEQUENCE,
    MALFORMED_RECORD, ALTS_NOT_EMPTY, MISSING_QUEUE,
)  # fmt: skip


# -- errors -----------------------------------------------------------------------------------------
class AuditError(CuesError):
    """The audit cannot run on this input (as opposed to finding violations, which it reports)."""


class LakeNotFoundError(AuditError):
    """The lake root does not exist or holds neither queues nor cues system tables."""


class NoSuchProcessorError(AuditError):
    """No backing queue for this processor id: it is not exactly-once or never ran here."""


# -- report -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Violation:
    """One broken guarantee. ``offsets`` is the half-open range ``[start, end)`` at fault in
    ``queue``/``partition`` (an input partition for coverage kinds, an output one otherwise)."""

    kind: str
    message: str
    processor: str | None = None
    queue: str | None = None
    partition: str | None = None
    offsets: tuple[int, int] | None = None
    hash: str | None = None
    step: int | None = None

    def to_text(self) -> str:
        where = []
        if self.queue is not None:
            where.append(
                f"{self.queue}/{self.partition}" if self.partition is not None else self.queue
            )
        if self.offsets is not None:
            where.append(f"offsets [{self.offsets[0]}, {self.offsets[1]})")
        if self.processor is not None:
            where.append(f"processor {self.processor}")
        if self.step is not None:
            where.append(f"step {self.step}")
        if self.hash is not None:
            where.append(f"hash {self.hash[:12]}")
        return f"[{self.kind}] {' '.join(where)}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["offsets"] = list(self.offsets) if self.offsets is not None else None
        return body


@dataclass(frozen=True)
class InputLag:
    """One input binding: offsets ``[0, delivered_end)`` are delivered, ``available`` exist."""

    binding: str
    queue: str
    partition: str
    delivered_end: int
    available: int

    @property
    def lag(self) -> int:
        return max(0, self.available - self.delivered_end)


@dataclass(frozen=True)
class ProcessorSummary:
    processor: str
    records: int
    epoch: int
    steps_delivered: int
    outcomes: Mapping[str, int]  # output / error / nil -> delivered steps
    rows_out: Mapping[str, int]  # queue -> rows of delivered steps
    last_delivered_step: int | None
    pending: str | None  # what recovery will finish, in words; None when nothing is pending
    pending_step: int | None
    inputs: tuple[InputLag, ...]

    @property
    def lag(self) -> int:
        return sum(i.lag for i in self.inputs)

    def to_text(self) -> str:
        outcomes = ", ".join(f"{self.outcomes.get(k, 0)} {k}" for k in ("output", "error", "nil"))
        last = "-" if self.last_delivered_step is None else str(self.last_delivered_step)
        lines = [
            f"{self.processor}: {self.steps_delivered} step(s) delivered ({outcomes}), last step "
            f"{last}, epoch {self.epoch}, {self.records} backing record(s)"
        ]
        lines.append(f"    pending: {self.pending or 'none'}")
        for i in self.inputs:
            lines.append(
                f"    input {i.binding} = {i.queue}/{i.partition}: delivered [0, {i.delivered_end}) "
                f"of {i.available}, lag {i.lag}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "processor": self.processor,
            "records": self.records,
            "epoch": self.epoch,
            "steps_delivered": self.steps_delivered,
            "outcomes": dict(self.outcomes),
            "rows_out": dict(self.rows_out),
            "last_delivered_step": self.last_delivered_step,
            "pending": self.pending,
            "pending_step": self.pending_step,
            "lag": self.lag,
            "inputs": [{**asdict(i), "lag": i.lag} for i in self.inputs],
        }


@dataclass(frozen=True)
class AuditReport:
    lake: str
    violations: tuple[Violation, ...]
    processors: Mapping[str, ProcessorSummary]
    queues_checked: tuple[str, ...]  # written by exactly-once processors: every hash checked
    queues_not_checked: tuple[str, ...]  # no exactly-once writer: not audited for hashes
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_kind(self, kind: str) -> list[Violation]:
        return [v for v in self.violations if v.kind == kind]

    def to_text(self, *, max_per_kind: int | None = 50) -> str:
        head = "OK" if self.ok else f"FAILED: {len(self.violations)} violation(s)"
        lines = [f"audit of lake {self.lake}: {head}"]
        lines.append(f"processors (exactly-once, from backing queues): {len(self.processors)}")
        for summary in self.processors.values():
            lines.append("  " + summary.to_text())
        lines.append(
            "queues checked (written by exactly-once processors): "
            + (", ".join(self.queues_checked) or "none")
        )
        if self.queues_not_checked:
            lines.append(
                "queues not checked for hashes (no exactly-once writer): "
                + ", ".join(self.queues_not_checked)
            )
        for note in self.notes:
            lines.append(f"note: {note}")
        if self.violations:
            lines.append("violations:")
            shown: Counter[str] = Counter()
            for v in self.violations:
                shown[v.kind] += 1
                if max_per_kind is None or shown[v.kind] <= max_per_kind:
                    lines.append("  " + v.to_text())
            for kind, n in shown.items():
                if max_per_kind is not None and n > max_per_kind:
                    lines.append(f"  ... and {n - max_per_kind} more [{kind}] (see --json)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "lake": self.lake,
            "violations": [v.to_dict() for v in self.violations],
            "counts": dict(Counter(v.kind for v in self.violations)),
            "processors": {p: s.to_dict() for p, s in self.processors.items()},
            "queues_checked": list(self.queues_checked),
            "queues_not_checked": list(self.queues_not_checked),
            "notes": list(self.notes),
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)


# -- discovery --------------------------------------------------------------------------------------
def check_lake(lake: Lake) -> None:
    """Raise :class:`LakeNotFoundError` unless ``lake`` exists and looks like a cues lake."""
    if lake.is_local:
        root = lake.local_path(lake.root)
        if not root.exists():
            raise LakeNotFoundError(
                f"no lake at {root}: the folder does not exist (pass --lake with the lake root)",
                root=str(root),
            )
        if not root.is_dir():
            raise LakeNotFoundError(
                f"no lake at {root}: it is a file, not a folder", root=str(root)
            )
        if not (root / "queues").is_dir() and not (root / "_cues").is_dir():
            raise LakeNotFoundError(
                f"{root} is not a cues lake: it has neither a queues/ nor a _cues/ folder",
                root=str(root),
            )
        return
    if not _list_dirs(join_uri(lake.root, "queues"), lake) and not _list_dirs(
        lake.system_uri(), lake
    ):
        raise LakeNotFoundError(
            f"no lake at {lake.root}: nothing under queues/ or _cues/", root=lake.root
        )


def _list_dirs(uri: str, lake: Lake) -> list[str]:
    if lake.is_local:
        folder = Path(lake.local_path(uri))
        return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    from pyarrow import fs

    try:
        filesystem, path = fs.FileSystem.from_uri(uri)
        infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
    except (OSError, pa.ArrowException) as exc:
        raise AuditError(f"cannot list {uri}: {exc}", uri=uri) from exc
    return sorted(i.base_name for i in infos if i.type == fs.FileType.Directory)


def backing_processors(lake: Lake) -> list[str]:
    """Ids of the processors that have a backing queue (a Delta table) under the lake."""
    from deltalake import DeltaTable

    return [
        name
        for name in _list_dirs(lake.system_uri("backing"), lake)
        if DeltaTable.is_deltatable(lake.system_uri("backing", name), storage_options=lake.options)
    ]


def _open_backing(lake: Lake, processor: str) -> Queue:
    # Opened read-only (BackingQueue(...) would create a missing table).
    return lake.queue(processor, uri=lake.system_uri("backing", processor))


# -- backing records --------------------------------------------------------------------------------
@dataclass
class _Backing:
    processor: str
    queue: Queue
    records: list[Record]
    cut: int  # next offset at the time of the read
    epoch: int
    violations: list[Violation]


def _parse_records(processor: str, table: pa.Table) -> tuple[list[Record], list[Violation]]:
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
        except (KeyError, TypeError, ValueError) as exc:
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
        records.append(record)
    return records, bad


def _read_backing(lake: Lake, processor: str) -> _Backing:
    queue = _open_backing(lake, processor)
    dt = queue.refresh()
    cut = queue.next_offset("0", snapshot=dt)
    version = dt.transaction_version("epoch")
    table = queue.read_arrow(partition="0", start=0, end=cut)
    records, bad = _parse_records(processor, table)
    return _Backing(processor, queue, records, cut, -1 if version is None else int(version), bad)


def _record_rows(record: Record) -> dict[str, dict[str, int]]:
    """``{queue: {partition: rows}}`` of an attempt (the ``rows`` map, else the ``files`` map)."""
    rows = record.outputs.get("rows") or {}
    out: dict[str, dict[str, int]] = {
        q: {p: int(n) for p, n in parts.items()} for q, parts in rows.items()
    }
    for q, parts in (record.outputs.get("files") or {}).items():
        for p in parts:
            out.setdefault(q, {}).setdefault(p, -1)  # -1: a staged file without a recorded count
    return out


def _outcome(record: Record) -> str:
    return {RecordType.ATTEMPT_OUTPUT: "output", RecordType.ATTEMPT_ERROR: "error"}.get(
        record.type, "nil"
    )


@dataclass
class _Steps:
    """A processor's records arranged as steps."""

    attempts: dict[int, Record]  # step -> the (first) attempt
    pending_snapshot: Record | None  # trailing snapshot without an attempt
    violations: list[Violation]


def _arrange(processor: str, records: list[Record]) -> _Steps:
    attempts: dict[int, Record] = {}
    bad: list[Violation] = []
    open_snapshot: Record | None = None
    next_step = 0
    for rec in records:
        if rec.type is RecordType.SNAPSHOT:
            if open_snapshot is not None and open_snapshot.hash == rec.hash:
                continue  # the same snapshot recorded again: harmless
            if open_snapshot is not None:
                bad.append(Violation(
                    STEP_SEQUENCE,
                    f"step {open_snapshot.step} (backing offset {open_snapshot.offset}) was "
                    f"abandoned: a snapshot of step {rec.step} was recorded (offset {rec.offset}) "
                    "before any attempt of it",
                    processor=processor, step=open_snapshot.step, hash=open_snapshot.hash,
                ))  # fmt: skip
            elif rec.step != next_step:
                bad.append(Violation(
                    STEP_SEQUENCE,
                    f"snapshot at backing offset {rec.offset} is step {rec.step}; the next step "
                    f"should be {next_step}",
                    processor=processor, step=rec.step, hash=rec.hash,
                ))  # fmt: skip
            open_snapshot = rec
            continue
        if rec.step in attempts:
            bad.append(Violation(
                STEP_SEQUENCE,
                f"step {rec.step} has a second attempt (backing offsets "
                f"{attempts[rec.step].offset} and {rec.offset}); only the first counts",
                processor=processor, step=rec.step, hash=rec.hash,
            ))  # fmt: skip
        elif open_snapshot is None or open_snapshot.hash != rec.hash:
            bad.append(Violation(
                STEP_SEQUENCE,
                f"attempt at backing offset {rec.offset} (step {rec.step}) does not follow a "
                "snapshot of the same step and hash",
                processor=processor, step=rec.step, hash=rec.hash,
            ))  # fmt: skip
        if rec.step not in attempts:
            attempts[rec.step] = rec
        open_snapshot = None
        next_step = max(next_step, rec.step + 1)
    return _Steps(attempts, open_snapshot, bad)


def _alts_violations(processor: str, snapshot: Snapshot) -> list[Violation]:
    if snapshot.alts is None:
        return []
    if snapshot.alts not in snapshot.inputs:
        return [Violation(
            MALFORMED_RECORD,
            f"alts snapshot of step {snapshot.step} chose binding {snapshot.alts!r}, which it does "
            f"not read (bindings: {sorted(snapshot.inputs)})",
            processor=processor, step=snapshot.step, hash=snapshot.delivery_hash,
        )]  # fmt: skip
    return [
        Violation(
            ALTS_NOT_EMPTY,
            f"alts step {snapshot.step} chose binding {snapshot.alts!r} but also reads "
            f"{r.size} offset(s) of binding {b!r}",
            processor=processor,
            queue=r.queue,
            partition=r.partition,
            offsets=(r.start, r.end),
            step=snapshot.step,
            hash=snapshot.delivery_hash,
        )  # fmt: skip
        for b, r in sorted(snapshot.inputs.items())
        if b != snapshot.alts and r.size
    ]


# -- queue rows -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Run:
    """Contiguous rows of one (partition, hash) in a queue."""

    partition: str
    hash: str
    start: int
    end: int  # exclusive
    processors: tuple[str, ...] = ()  # the `processor` column of error rows, when present

    @property
    def rows(self) -> int:
        return self.end - self.start


@dataclass
class _QueueRows:
    name: str
    exists: bool
    runs: dict[tuple[str, str], list[_Run]]  # (partition, hash) -> runs in offset order
    versions: dict[str, int | None]  # processor -> proc:{processor} app transaction
    hashes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.hashes = frozenset(h for _, h in self.runs)


def _hash_runs(table: pa.Table, with_processor: bool) -> dict[tuple[str, str], list[_Run]]:
    """Group rows by (partition, hash) into contiguous offset runs, vectorized."""
    table = table.filter(pc.is_valid(table[DELIVERY_HASH]))
    if table.num_rows == 0:
        return {}
    table = table.sort_by(
        [(PARTITION, "ascending"), (DELIVERY_HASH, "ascending"), (OFFSET, "ascending")]
    )
    part = table[PARTITION].combine_chunks()
    hashes = table[DELIVERY_HASH].combine_chunks()
    offsets = table[OFFSET].to_numpy()
    n = table.num_rows
    new_run = np.ones(n, dtype=bool)
    if n > 1:
        same_part = pc.equal(part[1:], part[:-1]).to_numpy(zero_copy_only=False)
        same_hash = pc.equal(hashes[1:], hashes[:-1]).to_numpy(zero_copy_only=False)
        consecutive = offsets[1:] == offsets[:-1] + 1
        new_run[1:] = ~(same_part & same_hash & consecutive)
    starts = np.flatnonzero(new_run)
    ends = np.append(starts[1:], n)
    procs = table["processor"].combine_chunks() if with_processor else None
    out: dict[tuple[str, str], list[_Run]] = defaultdict(list)
    part_list = part.take(pa.array(starts)).to_pylist()
    hash_list = hashes.take(pa.array(starts)).to_pylist()
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        names: tuple[str, ...] = ()
        if procs is not None:
            names = tuple(sorted({p for p in procs[s:e].to_pylist() if p is not None}))
        out[(part_list[i], hash_list[i])].append(
            _Run(part_list[i], hash_list[i], int(offsets[s]), int(offsets[e - 1]) + 1, names)
        )
    return dict(out)


def _read_queue_rows(lake: Lake, name: str, processors: Iterable[str]) -> _QueueRows:
    try:
        queue = lake.queue(name)
    except QueueError:
        return _QueueRows(name, False, {}, {})
    dt = queue.refresh()
    columns = [DELIVERY_HASH, PARTITION, OFFSET]
    names = set(queue.payload_schema.names)
    with_processor = {"processor", "step", "exception_type"} <= names
    if with_processor:
        columns += [MESSAGE_TYPE, "processor"]
    table = dt.to_pyarrow_dataset().to_table(columns=columns)
    versions = {p: dt.transaction_version(proc_app_id(p)) for p in processors}
    return _QueueRows(name, True, _hash_runs(table, with_processor), versions)


# -- the audit --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Known:
    processor: str
    record: Record


def audit(lake: Lake, *, graph: Graph | None = None) -> AuditReport:
    """Audit every exactly-once processor of ``lake`` (see the module docstring for the checks).

    ``graph`` (optional) adds cross-checks with the declared topology: exactly-once processors
    that never ran, backing queues of processors the graph does not declare, and error rows of
    at-least/at-most-once processors (which carry hashes without backing records).
    """
    if not isinstance(lake, Lake):
        raise AuditError(f"audit() needs a Lake, got {type(lake).__name__}")
    check_lake(lake)
    violations: list[Violation] = []
    notes: list[str] = []

    # 1. Backing queues first (see the module docstring on ordering).
    backings = {pid: _read_backing(lake, pid) for pid in backing_processors(lake)}
    steps: dict[str, _Steps] = {}
    known: dict[str, _Known] = {}  # hash -> attempt
    snapshot_only: dict[str, Record] = {}  # hash -> trailing snapshot without an attempt
    eo_queues: set[str] = set()
    for pid, b in backings.items():
        violations += b.violations
        arranged = _arrange(pid, b.records)
        violations += arranged.violations
        steps[pid] = arranged
        for rec in arranged.attempts.values():
            known.setdefault(rec.hash, _Known(pid, rec))
            eo_queues.update(_record_rows(rec))
            violations += _alts_violations(pid, rec.snapshot)
        if arranged.pending_snapshot is not None:
            snapshot_only[arranged.pending_snapshot.hash] = arranged.pending_snapshot
            violations += _alts_violations(pid, arranged.pending_snapshot.snapshot)

    # 2. Then the queues (rows of every exactly-once-written queue) and input end offsets.
    rows = {q: _read_queue_rows(lake, q, backings) for q in sorted(eo_queues)}
    input_ends = _input_ends(lake, steps)

    # 3. Attempts appended meanwhile: their hashes are known, their steps are the next audit's.
    late: dict[str, _Known] = {}
    for pid, b in backings.items():
        table = b.queue.read_arrow(partition="0", start=b.cut)
        for rec in _parse_records(pid, table)[0]:
            if rec.is_attempt:
                late.setdefault(rec.hash, _Known(pid, rec))

    for name, qr in rows.items():
        if not qr.exists:
            writers = sorted(
                {k.processor for k in known.values() if name in _record_rows(k.record)}
            )
            violations.append(Violation(
                MISSING_QUEUE,
                f"queue {name!r} is named by attempts of {', '.join(writers)} but does not exist",
                queue=name,
            ))  # fmt: skip

    # 4. Which attempts are delivered; per-(queue, partition, hash) row checks.
    summaries: dict[str, ProcessorSummary] = {}
    delivered: dict[str, list[Record]] = {}
    pendings: dict[str, str | None] = {}
    for pid, arranged in steps.items():
        delivered[pid], pendings[pid], bad = _delivered_steps(pid, arranged, rows)
        violations += bad

    violations += _row_checks(rows, known, late, snapshot_only, graph, backings, notes)
    violations += _transaction_checks(rows, known, late)

    # 5. Input coverage of delivered steps.
    for pid, arranged in steps.items():
        cover_violations, lags = _coverage(pid, delivered[pid], input_ends)
        violations += cover_violations
        got = delivered[pid]
        pending = pendings[pid]
        outcomes = Counter(_outcome(r) for r in got)
        rows_out: Counter[str] = Counter()
        for r in got:
            for q, parts in (r.outputs.get("rows") or {}).items():
                rows_out[q] += sum(int(n) for n in parts.values())
        pending_step = None
        if arranged.pending_snapshot is not None:
            pending_step = arranged.pending_snapshot.step
        elif pending is not None:
            pending_step = max(arranged.attempts)
        summaries[pid] = ProcessorSummary(
            processor=pid,
            records=len(backings[pid].records),
            epoch=backings[pid].epoch,
            steps_delivered=len(got),
            outcomes=dict(outcomes),
            rows_out=dict(rows_out),
            last_delivered_step=max((r.step for r in got), default=None),
            pending=pending,
            pending_step=pending_step,
            inputs=tuple(lags),
        )

    # 6. Cross-checks with the graph, when given.
    all_queues = set(lake.list_queues())
    if graph is not None:
        notes += _graph_notes(graph, backings)
    return AuditReport(
        lake=lake.root,
        violations=tuple(_sorted(violations)),
        processors=dict(sorted(summaries.items())),
        queues_checked=tuple(sorted(q for q in eo_queues if rows[q].exists)),
        queues_not_checked=tuple(sorted(all_queues - eo_queues)),
        notes=tuple(notes),
    )


def _sorted(violations: list[Violation]) -> list[Violation]:
    return sorted(
        violations,
        key=lambda v: (
            KINDS.index(v.kind) if v.kind in KINDS else len(KINDS),
            v.processor or "",
            v.queue or "",
            v.partition or "",
            v.offsets or (-1, -1),
            v.step if v.step is not None else -1,
        ),
    )


def _input_ends(lake: Lake, steps: Mapping[str, _Steps]) -> dict[tuple[str, str], int | None]:
    ends: dict[tuple[str, str], int | None] = {}
    queues: dict[str, Queue | None] = {}
    for arranged in steps.values():
        snaps = [r.snapshot for r in arranged.attempts.values()]
        if arranged.pending_snapshot is not None:
            snaps.append(arranged.pending_snapshot.snapshot)
        for snap in snaps:
            for r in snap.inputs.values():
                key = (r.queue, r.partition)
                if key in ends:
                    continue
                if r.queue not in queues:
                    try:
                        queues[r.queue] = lake.queue(r.queue)
                    except QueueError:
                        queues[r.queue] = None
                q = queues[r.queue]
                ends[key] = None if q is None else q.next_offset(r.partition)
    return ends


def _delivered_steps(
    pid: str, arranged: _Steps, rows: Mapping[str, _QueueRows]
) -> tuple[list[Record], str | None, list[Violation]]:
    """Delivered attempts in step order, the pending work in words, and undelivered attempts."""
    got: list[Record] = []
    bad: list[Violation] = []
    pending: str | None = None
    last_step = max(arranged.attempts, default=None)
    for step in sorted(arranged.attempts):
        rec = arranged.attempts[step]
        missing = [q for q in sorted(_record_rows(rec)) if rec.hash not in rows[q].hashes]
        if not missing:
            got.append(rec)
            continue
        if step == last_step and arranged.pending_snapshot is None:
            pending = (
                f"step {step}: attempt ({_outcome(rec)}) recorded, commit to "
                f"{', '.join(missing)} not yet made (recovery rolls it forward)"
            )
            continue
        for q in missing:
            bad.append(Violation(
                UNDELIVERED,
                f"step {step}'s attempt ({_outcome(rec)}) names queue {q!r} but no row of it "
                f"carries hash {rec.hash}, and later steps followed: its output was lost",
                processor=pid, queue=q, step=step, hash=rec.hash,
                partition=next(iter(_record_rows(rec)[q]), None),
            ))  # fmt: skip
    if arranged.pending_snapshot is not None:
        snap = arranged.pending_snapshot.snapshot
        reads = ", ".join(
            f"{r.queue}/{r.partition} [{r.start}, {r.end})" for _, r in sorted(snap.inputs.items())
        )
        pending = (
            f"step {snap.step}: snapshot of {reads} recorded, no attempt yet (retried on start)"
        )
    return got, pending, bad


def _row_checks(
    rows: Mapping[str, _QueueRows],
    known: Mapping[str, _Known],
    late: Mapping[str, _Known],
    snapshot_only: Mapping[str, Record],
    graph: Graph | None,
    backings: Mapping[str, _Backing],
    notes: list[str],
) -> list[Violation]:
    bad: list[Violation] = []
    not_audited: Counter[tuple[str, str]] = Counter()
    for name, qr in rows.items():
        for (part, h), runs in sorted(qr.runs.items()):
            total = sum(r.rows for r in runs)
            span = (runs[0].start, runs[-1].end)
            k = known.get(h)
            if k is None:
                if h in late:
                    continue  # appended after the audit read the backing queues
                reason = _non_eo_writer(runs, graph, backings)
                if reason is not None:
                    not_audited[(name, reason)] += total
                    continue
                snap = snapshot_only.get(h)
                for run in runs:
                    if snap is not None:
                        msg = (
                            f"{run.rows} row(s) carry the hash of step {snap.step} of processor "
                            f"{snap.snapshot.processor!r}, which has a snapshot but no attempt: "
                            "rows were committed before the attempt was recorded"
                        )
                    else:
                        msg = (
                            f"{run.rows} row(s) carry a delivery hash that no attempt of any "
                            "exactly-once processor recorded"
                        )
                    bad.append(Violation(
                        UNKNOWN_HASH, msg, queue=name, partition=part,
                        offsets=(run.start, run.end), hash=h,
                        processor=snap.snapshot.processor if snap is not None else None,
                        step=snap.step if snap is not None else None,
                    ))  # fmt: skip
                continue
            pid, rec = k.processor, k.record
            expected = _record_rows(rec).get(name, {}).get(part)
            if expected is None:
                bad.append(Violation(
                    UNEXPECTED_OUTPUT,
                    f"{total} row(s) of step {rec.step} of {pid!r} landed in {name}/{part}, which "
                    f"its attempt does not name (it names {_names(_record_rows(rec))})",
                    processor=pid, queue=name, partition=part, offsets=span, hash=h, step=rec.step,
                ))  # fmt: skip
                continue
            runs_text = ", ".join(f"[{r.start}, {r.end})" for r in runs)
            if expected >= 0 and total > expected:
                first = runs[0]
                extra = [(r.start, r.end) for r in runs[1:]]
                if first.rows > expected:
                    extra.insert(0, (first.start + expected, first.end))
                for start, end in extra:
                    bad.append(Violation(
                        DELIVERED_TWICE,
                        f"step {rec.step} of {pid!r} is delivered more than once in "
                        f"{name}/{part}: {total} rows with its hash where the attempt recorded "
                        f"{expected} (runs {runs_text}); rows [{start}, {end}) repeat it",
                        processor=pid, queue=name, partition=part, offsets=(start, end), hash=h,
                        step=rec.step,
                    ))  # fmt: skip
            elif expected >= 0 and total < expected:
                bad.append(Violation(
                    ROW_COUNT_MISMATCH,
                    f"step {rec.step} of {pid!r} has {total} row(s) in {name}/{part} but its "
                    f"attempt recorded {expected} (runs {runs_text})",
                    processor=pid, queue=name, partition=part, offsets=span, hash=h, step=rec.step,
                ))  # fmt: skip
            elif len(runs) > 1:
                bad.append(Violation(
                    NOT_CONTIGUOUS,
                    f"step {rec.step} of {pid!r} has its {total} row(s) in {name}/{part} split "
                    f"into runs {runs_text}; one commit gives one contiguous range",
                    processor=pid, queue=name, partition=part, offsets=span, hash=h, step=rec.step,
                ))  # fmt: skip
        # Partitions an attempt names in a queue that holds some of its rows but not these.
        present = defaultdict(set)
        for part, h in qr.runs:
            present[h].add(part)
        for h, parts in present.items():
            k = known.get(h)
            if k is None:
                continue
            for part, n in sorted(_record_rows(k.record).get(name, {}).items()):
                if part not in parts and n != 0:
                    bad.append(Violation(
                        ROW_COUNT_MISMATCH,
                        f"step {k.record.step} of {k.processor!r} recorded {n} row(s) for "
                        f"{name}/{part} but none are there, while its other partitions of "
                        f"{name} are (one commit writes them all)",
                        processor=k.processor, queue=name, partition=part, hash=h,
                        step=k.record.step,
                    ))  # fmt: skip
    for (name, reason), n in sorted(not_audited.items()):
        notes.append(f"{n} row(s) of {name} with hashes not audited: {reason}")
    return bad


def _non_eo_writer(
    runs: list[_Run], graph: Graph | None, backings: Mapping[str, _Backing]
) -> str | None:
    """Why rows with an unknown hash are legitimately unaudited (error rows of a processor that
    is not exactly-once), or None when they are not."""
    names = {p for r in runs for p in r.processors}
    if not names or len(names) != 1 or any(len(r.processors) != 1 for r in runs):
        return None
    (name,) = names
    if name in backings:
        return None  # an exactly-once processor: its hashes must be its attempts'
    if graph is None:
        return f"error rows of processor {name!r}, which has no backing queue (not exactly-once)"
    proc = graph.processors.get(name)
    if proc is not None and proc.strategy is not Strategy.EXACTLY_ONCE:
        return f"error rows of {proc.strategy.value} processor {name!r}"
    return None


def _transaction_checks(
    rows: Mapping[str, _QueueRows], known: Mapping[str, _Known], late: Mapping[str, _Known]
) -> list[Violation]:
    bad: list[Violation] = []
    for name, qr in rows.items():
        top: dict[str, int] = {}
        for _, h in qr.runs:
            k = known.get(h)
            if k is not None and name in _record_rows(k.record):
                top[k.processor] = max(top.get(k.processor, -1), k.record.step)
        named: dict[str, int] = {}
        for k in [*known.values(), *late.values()]:
            if name in _record_rows(k.record):
                named[k.processor] = max(named.get(k.processor, -1), k.record.step)
        for pid, version in sorted(qr.versions.items()):
            highest = top.get(pid)
            if highest is not None and (version is None or version < highest):
                bad.append(Violation(
                    APP_TRANSACTION,
                    f"{name} holds rows of step {highest} of {pid!r} but its app transaction "
                    f"{proc_app_id(pid)} is {version}: a roll-forward would commit that step again",
                    processor=pid, queue=name, step=highest,
                ))  # fmt: skip
            elif version is not None and version > named.get(pid, -1):
                bad.append(Violation(
                    APP_TRANSACTION,
                    f"{name}'s app transaction {proc_app_id(pid)} is {version}, but {pid!r} has "
                    f"no attempt of step {version} or later that writes {name}",
                    processor=pid, queue=name, step=int(version),
                ))  # fmt: skip
    return bad


def _coverage(
    pid: str, delivered: list[Record], input_ends: Mapping[tuple[str, str], int | None]
) -> tuple[list[Violation], list[InputLag]]:
    bad: list[Violation] = []
    by_binding: dict[tuple[str, str, str], list[tuple[Range, int]]] = defaultdict(list)
    for rec in delivered:
        for binding, r in rec.snapshot.inputs.items():
            by_binding[(binding, r.queue, r.partition)].append((r, rec.step))
    lags = []
    for (binding, queue, part), ranges in sorted(by_binding.items()):
        available = input_ends.get((queue, part))
        cursor, cursor_step = 0, None
        for r, step in sorted(ranges, key=lambda x: (x[0].start, x[0].end, x[1])):
            if r.size < 0:
                bad.append(Violation(
                    MALFORMED_RECORD, f"step {step} reads the inverted range [{r.start}, {r.end})",
                    processor=pid, queue=queue, partition=part, offsets=(r.start, r.end), step=step,
                ))  # fmt: skip
                continue
            if r.size == 0:
                continue
            if available is not None and r.end > available:
                bad.append(Violation(
                    BEYOND_END,
                    f"step {step} read [{r.start}, {r.end}) of {queue}/{part}, which only has "
                    f"{available} offset(s)",
                    processor=pid, queue=queue, partition=part,
                    offsets=(max(r.start, available), r.end), step=step,
                ))  # fmt: skip
            if r.start > cursor:
                after = "the start" if cursor_step is None else f"step {cursor_step}"
                bad.append(Violation(
                    GAP,
                    f"offsets [{cursor}, {r.start}) of {queue}/{part} were never delivered by "
                    f"{pid!r} (binding {binding!r}): {after} ends at {cursor}, step {step} "
                    f"starts at {r.start}",
                    processor=pid, queue=queue, partition=part, offsets=(cursor, r.start), step=step,
                ))  # fmt: skip
            elif r.start < cursor:
                bad.append(Violation(
                    OVERLAP,
                    f"offsets [{r.start}, {min(cursor, r.end)}) of {queue}/{part} were delivered "
                    f"twice by {pid!r} (binding {binding!r}): by step {cursor_step} and by step {step}",
                    processor=pid, queue=queue, partition=part,
                    offsets=(r.start, min(cursor, r.end)), step=step,
                ))  # fmt: skip
            if r.end >= cursor:
                cursor, cursor_step = r.end, step
        lags.append(
            InputLag(binding, queue, part, cursor, available if available is not None else cursor)
        )
    return bad, lags


def _graph_notes(graph: Graph, backings: Mapping[str, _Backing]) -> list[str]:
    notes = []
    for pid, proc in sorted(graph.processors.items()):
        eo = proc.strategy is Strategy.EXACTLY_ONCE and proc.inputs
        if eo and pid not in backings:
            notes.append(
                f"graph {graph.name!r}: exactly-once processor {pid!r} has no backing queue yet (never ran)"
            )
        if not eo and pid in backings:
            notes.append(
                f"graph {graph.name!r}: processor {pid!r} is {proc.strategy.value}/{proc.kind.value} but has a backing queue"
            )
    for pid in sorted(set(backings) - set(graph.processors)):
        notes.append(
            f"backing queue of processor {pid!r}, which graph {graph.name!r} does not declare"
        )
    return notes


def _names(rows: Mapping[str, Mapping[str, int]]) -> str:
    return (
        ", ".join(f"{q}/{p}" for q, parts in sorted(rows.items()) for p in sorted(parts))
        or "nothing"
    )


# -- the backing queue in words ---------------------------------------------------------------------
def describe_backing(lake: Lake, processor: str, *, last: int | None = 20) -> list[str]:
    """The last ``last`` steps of a processor's backing queue, one line per step, e.g.
    ``step 7: snapshot of orders/0 [70, 80) — hash 1a2b3c4d…; attempt: output 10 rows to
    enriched/0 (committed)``. Raises :class:`NoSuchProcessorError` when there is no backing queue."""
    check_lake(lake)
    known = backing_processors(lake)
    if processor not in known:
        raise NoSuchProcessorError(
            f"no backing queue for processor {processor!r} in lake {lake.root} (processors with "
            f"one: {', '.join(known) or 'none'}); only exactly-once processors have one",
            processor=processor,
        )
    b = _read_backing(lake, processor)
    by_step: dict[int, list[Record]] = defaultdict(list)
    for rec in b.records:
        by_step[rec.step].append(rec)
    shown = sorted(by_step)[-last:] if last else sorted(by_step)
    versions: dict[str, int | None] = {}

    def committed(queue: str, step: int) -> str:
        if queue not in versions:
            try:
                versions[queue] = (
                    lake.queue(queue).refresh().transaction_version(proc_app_id(processor))
                )
            except QueueError:
                versions[queue] = None
        v = versions[queue]
        return "committed" if v is not None and v >= step else "not committed"

    lines = [
        f"backing queue of {processor} at {b.queue.uri}: {len(b.records)} record(s), "
        f"{len(by_step)} step(s), epoch {b.epoch}"
        + (f" (showing the last {len(shown)})" if len(shown) < len(by_step) else "")
    ]
    for step in shown:
        recs = by_step[step]
        snap = recs[0].snapshot
        reads = (
            ", ".join(
                f"{r.queue}/{r.partition} [{r.start}, {r.end})"
                for _, r in sorted(snap.inputs.items())
            )
            or "no inputs"
        )
        alts = f" (alts: {snap.alts})" if snap.alts else ""
        kinds = [r for r in recs if r.type is RecordType.SNAPSHOT]
        head = f"step {step}: {'snapshot' if kinds else 'no snapshot record'} of {reads}{alts} — hash {snap.delivery_hash[:8]}…"
        parts = []
        for rec in (r for r in recs if r.is_attempt):
            outcome = _outcome(rec)
            out = _record_rows(rec)
            if rec.type is RecordType.ATTEMPT_NIL or not out:
                parts.append("attempt: nil (no output)")
                continue
            targets = ", ".join(
                f"{n if n >= 0 else '?'} row{'s' if n != 1 else ''} to {q}/{p} ({committed(q, step)})"
                for q, ps in sorted(out.items())
                for p, n in sorted(ps.items())
            )
            err = f" {rec.error!r}" if rec.error else ""
            parts.append(f"attempt: {outcome}{err} {targets}")
        if not parts:
            parts.append("no attempt yet (pending: retried on the next start)")
        lines.append(head + "; " + "; ".join(parts))
    if not by_step:
        lines.append("(no records)")
    return lines
