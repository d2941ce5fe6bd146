"""The audit's result: :class:`Violation` (one broken guarantee, by kind), per-processor
:class:`ProcessorSummary` with :class:`InputLag`, and the :class:`AuditReport` as text or JSON."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# Violation kinds, by check (see the package docstring). The order is the report's order.
UNREADABLE = "unreadable"  # step 5
CORRUPT_LOG = "corrupt_log"  # step 5
GAP = "gap"  # step 1
OVERLAP = "overlap"
BEYOND_END = "beyond_end"
POSITION = "position"  # step 1: a stored position that its history does not explain
UNKNOWN_HASH = "unknown_hash"  # step 2
UNEXPECTED_OUTPUT = "unexpected_output"
NO_DELIVERY_HASH = "no_delivery_hash"
DELIVERED_TWICE = "delivered_twice"  # step 3
ROW_COUNT_MISMATCH = "row_count_mismatch"
NOT_CONTIGUOUS = "not_contiguous"
UNDELIVERED = "undelivered"
APP_TRANSACTION = "app_transaction"
STEP_SEQUENCE = "step_sequence"  # step 4
MALFORMED_RECORD = "malformed_record"
ALTS_NOT_EMPTY = "alts_not_empty"
MISSING_QUEUE = "missing_queue"
OUTSIDE_LAKE = "outside_lake"  # step 4/5: a record or a commit names a file outside its place
ROWS_WITHOUT_INPUT = "rows_without_input"  # step 3: a step that read nothing produced rows
PLATFORM_ERROR = "platform_error"  # step 6
ERROR_ROW_STEP = "error_row_step"  # step 7: an error row's processor/step are not its hash's step
ERROR_ROW_INPUTS = "error_row_inputs"  # neither the step's ranges nor one offset of them
ERROR_ROW_TWICE = "error_row_twice"  # an input row in two error rows of a step
REPLAY_MISSING = "replay_missing"  # a replay step names an error row that is not there
REPLAY_UNVERIFIABLE = "replay_unverifiable"  # ... one that cannot be read (not retention)
REPLAY_MISMATCH = "replay_mismatch"  # ... one of another lane, other inputs, a contract break
REPLAYED_TWICE = "replayed_twice"  # an error row replayed by two attempts
KINDS = (
    UNREADABLE, CORRUPT_LOG, OUTSIDE_LAKE, GAP, OVERLAP, BEYOND_END, POSITION, UNKNOWN_HASH,
    UNEXPECTED_OUTPUT, NO_DELIVERY_HASH, DELIVERED_TWICE, ROW_COUNT_MISMATCH, ROWS_WITHOUT_INPUT,
    NOT_CONTIGUOUS, UNDELIVERED, APP_TRANSACTION, STEP_SEQUENCE, MALFORMED_RECORD, ALTS_NOT_EMPTY,
    MISSING_QUEUE, PLATFORM_ERROR, ERROR_ROW_STEP, ERROR_ROW_INPUTS, ERROR_ROW_TWICE,
    REPLAY_MISSING, REPLAY_UNVERIFIABLE, REPLAY_MISMATCH, REPLAYED_TWICE,
)  # fmt: skip


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
    file: str | None = None  # storage kinds: the file at fault, when one is

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
    error_rows: int = 0  # rows with its steps' hashes in error queues (step 7)
    error_rows_replayed: int = 0  # ... of which a replay step of it re-fed

    @property
    def lag(self) -> int:
        return sum(i.lag for i in self.inputs)

    @property
    def error_rows_pending(self) -> int:
        """Error rows no replay step re-fed yet (what ``cues errors replay`` would choose)."""
        return self.error_rows - self.error_rows_replayed

    def to_text(self) -> str:
        outcomes = ", ".join(f"{self.outcomes.get(k, 0)} {k}" for k in ("output", "error", "nil"))
        last = "-" if self.last_delivered_step is None else str(self.last_delivered_step)
        lines = [
            f"{self.processor}: {self.steps_delivered} step(s) delivered ({outcomes}), last step "
            f"{last}, epoch {self.epoch}, {self.records} backing record(s)"
        ]
        lines.append(f"    pending: {self.pending or 'none'}")
        if self.error_rows:
            lines.append(f"    error rows: {self.error_rows} ({self.error_rows_replayed} replayed, "
                         f"{self.error_rows_pending} pending)")
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
            "error_rows": self.error_rows,
            "error_rows_replayed": self.error_rows_replayed,
            "error_rows_pending": self.error_rows_pending,
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
    # retention (issue 23): queue -> partition -> rows retained away (the start offset: offsets
    # [0, start) were removed on purpose), for every partition whose start is above 0
    retained_below: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # what the audit could only check structurally because rows are retained away:
    # input_ranges_below_start (delivered steps' input ranges reaching below the start: their
    # offsets are checked, their rows are gone), output_steps_committed (steps whose output rows
    # are below the start, their commit proven by its record or app transaction),
    # output_steps_by_order (the same, checked by step order and row count only),
    # replays_of_retained_rows (replay steps whose error row is below the error queue's start)
    retained_steps: Mapping[str, int] = field(default_factory=dict)

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
        if self.retained_below:
            lines.append(
                "retained away (offsets below the start offset, removed by retention, not lost): "
                + ", ".join(f"{q}/{p} [0, {n})" for q, parts in sorted(self.retained_below.items())
                            for p, n in sorted(parts.items()))
            )
            lines.append(
                "checked only structurally (their rows are retained away): "
                f"{self.retained_steps.get('input_ranges_below_start', 0)} input range(s) of "
                "delivered steps (offsets checked, rows gone), "
                f"{self.retained_steps.get('output_steps_committed', 0)} step(s) whose output rows "
                "are gone (commit proven), "
                f"{self.retained_steps.get('output_steps_by_order', 0)} (by step order and row "
                "count only)"
                + (f", {self.retained_steps['replays_of_retained_rows']} replay step(s) of error "
                   "rows retained away (their inputs not compared)"
                   if self.retained_steps.get("replays_of_retained_rows") else "")
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
            "retained_below": {q: dict(parts) for q, parts in self.retained_below.items()},
            "retained_steps": dict(self.retained_steps),
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)


def sort_violations(violations: list[Violation]) -> list[Violation]:
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
