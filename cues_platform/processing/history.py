"""A processor's step history: its backing-queue records merged with the records of its
one-commit steps, read back from the home queue's Delta log.

A one-commit step (``processing/home.py``) has no backing record: its home commit carries the
snapshot, outcome and row counts in its commit metadata (``cues.step_record = commit``). This
module turns those commits back into :class:`Record` values (with ``version`` set to the Delta
version of the commit) so that the tests and the auditor see one history per processor, in step
order, whichever path each step took. Reading it is O(commits in the log): it is for audits and
tests, never for recovery (which reads app transactions, O(1)).

Delta keeps commit entries for the table's ``delta.logRetentionDuration`` (30 days by default)
after a checkpoint, and no queue commit trims them by itself (``queues/maintenance.py``,
``COMMIT_HOOKS``). So that trimming loses no record, the stepper copies the one-commit steps'
records into a *digest* record of its backing queue at every backing maintenance (every
``Options.backing_maintenance_every`` steps, default 1,000), then trims the home's expired
entries itself; a digest is expanded back into one attempt per step. Only ``cues queue
maintain`` can trim steps that were not digested yet: those of a processor stopped for longer
than the log retention before its next maintenance point.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cues_platform.processing.backing import BackingQueue, Record, RecordType, Snapshot
from cues_platform.processing.home import STEP_RECORD_KEY
from cues_platform.queues import Lake, Queue

_TYPES = {"attempt_output", "attempt_error", "attempt_nil"}


@dataclass(frozen=True)
class BadCommit:
    """A commit that claims to be a step record but does not parse."""

    queue: str
    version: int
    processor: str | None
    problem: str


def commit_records(queue: Queue, *, processor: str | None = None,
                   since: int = -1) -> tuple[dict[str, list[Record]], list[BadCommit]]:
    """``({processor: [records in version order]}, malformed)`` of the step-record commits of
    ``queue`` newer than version ``since``."""
    found: dict[str, list[Record]] = {}
    bad: list[BadCommit] = []
    for entry in reversed(queue.refresh().history()):
        version = int(entry.get("version", -1))
        if version <= since or entry.get(STEP_RECORD_KEY) != "commit":
            continue
        pid = entry.get("cues.processor")
        if processor is not None and pid != processor:
            continue
        try:
            snapshot = Snapshot.from_json(entry["cues.snapshot"])
            kind = RecordType(entry["cues.outcome"])
            rows = json.loads(entry.get("cues.rows") or "{}")
            if kind.value not in _TYPES or not isinstance(rows, Mapping):
                raise ValueError(f"outcome {kind.value!r} / rows {rows!r}")
            problems = []
            if snapshot.processor != pid:
                problems.append(f"its snapshot names processor {snapshot.processor!r}")
            if str(snapshot.step) != entry.get("cues.step") or snapshot.delivery_hash != entry.get("cues.hash"):
                problems.append("its step/hash metadata disagree with its snapshot")
            if problems:
                raise ValueError("; ".join(problems))
            record = Record(kind, snapshot, int(entry.get("cues.epoch", -1)),
                            {"rows": rows} if rows else {}, version=version)
        except (KeyError, TypeError, ValueError) as exc:
            bad.append(BadCommit(queue.name, version, pid, f"{type(exc).__name__}: {exc}"))
            continue
        found.setdefault(str(pid), []).append(record)
    return found, bad


def merge(backing: Iterable[Record], commits: Iterable[Record]) -> list[Record]:
    """One history in step order: the backing queue's own records (snapshots, attempts) in their
    order, with the one-commit steps' records (from digests in the backing queue, or read from the
    home queue's log: the first seen of a step wins) each placed before the first own record of a
    later step. A backing attempt of a step wins over a one-commit record of it (the home commit
    of an attempt-path step is not a step record, so the two never describe one step)."""
    own, digested = [], []
    for r in backing:
        (own if r.version is None else digested).append(r)
    taken = {r.step for r in own if r.is_attempt}
    pending: dict[int, Record] = {}
    for c in [*digested, *commits]:
        if c.step not in taken:
            pending.setdefault(c.step, c)
    ordered = [pending[k] for k in sorted(pending)]
    out: list[Record] = []
    i = 0
    for rec in own:
        while i < len(ordered) and ordered[i].step < rec.step:
            out.append(ordered[i])
            i += 1
        out.append(rec)
    out.extend(ordered[i:])
    return out


def step_history(backing: Iterable[Record], queues: Iterable[Queue], processor: str) -> list[Record]:
    """One processor's whole history: its backing records and the step records in ``queues``."""
    commits: list[Record] = []
    for q in queues:
        commits += commit_records(q, processor=processor)[0].get(processor, [])
    return merge(backing, commits)



def processor_history(lake: Lake, processor: str) -> list[Record]:
    """The whole step history of ``processor`` in ``lake`` (its backing queue and every queue)."""
    backing = BackingQueue(lake, processor).records()
    return step_history(backing, [lake.queue(q) for q in lake.list_queues()], processor)
