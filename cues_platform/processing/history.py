"""A processor's step history: its backing-queue records merged with the records of its
one-commit steps, read back from the home queue's Delta log.

A one-commit step (``processing/home.py``) has no backing record: its home commit carries the
snapshot, outcome and row counts in its commit metadata (``cues.step_record = commit``). This
module turns those commits back into :class:`Record` values (with ``version`` set to the Delta
version of the commit) so that the tests and the auditor see one history per processor, in step
order, whichever path each step took. Reading it is O(commits in the log): it is for audits and
tests, never for recovery (which reads app transactions, O(1)).

Digests: the log of a home queue is trimmed (``processing/home.py``, :func:`trim_home_log`), so
the step records in it are first copied into the home's *digest queue*
(``{lake}/_cues/digests/{home}``, :class:`HomeDigests`). A digest covers every step commit of
*every* processor homed in that queue (lanes share homes) between the previous digest's version
and its own ``upto``, so a quiet lane's steps are digested by a busy lane's maintenance and a
trim below ``upto`` never deletes a step commit that no digest holds, whoever made it. Contract
of :meth:`HomeDigests.digest`:

1. ``since`` = the newest digest's ``upto`` (-1: none); ``upto`` = the home's version now.
2. Read the step-record commits of the log in ``(since, upto]`` (every processor).
3. Append one digest row per processor that has some (one commit). Only now may the home's
   entries up to ``upto`` be trimmed.

By induction every step commit up to the newest digest's ``upto`` is in a digest: each digest
starts where a committed one ended. Two digests made at once overlap (both start at the same
``since``); :func:`commit_records` keeps the first record of a version, so an overlap is
harmless. A crash after 2 digests nothing and trims nothing; after 3 the next trim may go on.
Digests written to a processor's backing queue by earlier versions are still read
(:mod:`cues_platform.processing.backing`, ``expand``).

Who owns what: a digest queue is owned by its home queue; nothing deletes its rows (they are the
audit's record of steps whose log entries are gone); it grows by one commit per
``backing_maintenance_every`` steps of the busiest processor homed there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pyarrow as pa

from cues_platform.processing.backing import (
    BACKING_PROPERTIES,
    BackingQueue,
    Record,
    RecordType,
    Snapshot,
    digest,
    expand,
)
from cues_platform.processing.home import STEP_RECORD_KEY
from cues_platform.queues import Lake, Queue

DIGEST_SCHEMA = pa.schema([
    pa.field("processor", pa.string(), nullable=False),
    pa.field("since", pa.int64(), nullable=False),  # the digest covers home versions (since, upto]
    pa.field("upto", pa.int64(), nullable=False),
    pa.field("record", pa.string(), nullable=False),  # the steps, as a backing digest record's
])

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
    ``queue`` newer than version ``since``: those its digest queue holds (their log entries may be
    trimmed) and those still in its log, each version once."""
    digested = HomeDigests.existing(queue.lake, queue.name)
    found = digested.records(processor=processor, since=since) if digested is not None else {}
    logged, bad = log_records(queue, processor=processor, since=since)
    for pid, recs in logged.items():
        have = {r.version for r in found.get(pid, [])}
        found.setdefault(pid, []).extend(r for r in recs if r.version not in have)
    return {pid: sorted(recs, key=lambda r: r.version or -1) for pid, recs in found.items()}, bad


def log_records(queue: Queue, *, processor: str | None = None,
                since: int = -1) -> tuple[dict[str, list[Record]], list[BadCommit]]:
    """:func:`commit_records` of the log alone."""
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



class HomeDigests:
    """The digest queue of home queue ``home`` (see the module docstring for the contract)."""

    def __init__(self, lake: Lake, home: str) -> None:
        self.home = home
        self.queue: Queue = lake.create_queue(
            home, schema=DIGEST_SCHEMA, partitions=("0",), exist_ok=True,
            uri=lake.system_uri("digests", home), properties=BACKING_PROPERTIES,
            description=f"digests of the step commits of home queue {home}")

    @classmethod
    def existing(cls, lake: Lake, home: str) -> HomeDigests | None:
        from deltalake import DeltaTable

        uri = lake.system_uri("digests", home)
        return cls(lake, home) if DeltaTable.is_deltatable(uri, storage_options=lake.options) else None

    def covered(self) -> int:
        """The newest digest's ``upto`` (-1: none), read in O(1)."""
        last = self.queue.last_offset("0")
        if last is None:
            return -1
        return int(self.queue.read_arrow(partition="0", start=last, end=last + 1,
                                         columns=["upto"])["upto"][0].as_py())

    def digest(self, home: Queue) -> int:
        """Steps 1-3: digest the step commits of ``home`` not digested yet; returns ``upto``, the
        version up to which every step commit of ``home`` is now in a digest."""
        # Step 1
        since = self.covered()
        upto = home.refresh().version()
        if upto <= since:
            return since
        # Step 2
        found, _ = log_records(home, since=since)
        found = {pid: [r for r in recs if (r.version or -1) <= upto] for pid, recs in found.items()}
        # Step 3
        rows = [(pid, digest(recs, -1)) for pid, recs in sorted(found.items()) if recs]
        if rows:
            table = pa.table({"processor": [pid for pid, _ in rows], "since": [since] * len(rows),
                              "upto": [upto] * len(rows),
                              "record": [json.dumps(d.outputs, sort_keys=True) for _, d in rows]},
                             schema=DIGEST_SCHEMA)
        else:  # nothing to hold, but the mark moves on (an empty row of no processor)
            table = pa.table({"processor": [""], "since": [since], "upto": [upto], "record": ["{}"]},
                             schema=DIGEST_SCHEMA)
        self.queue.append(table, partition="0")
        return upto

    def records(self, *, processor: str | None = None, since: int = -1) -> dict[str, list[Record]]:
        """``{processor: [records]}`` of the digested step commits newer than version ``since``."""
        out: dict[str, list[Record]] = {}
        for row in self.queue.read_arrow(partition="0").to_pylist():
            pid = row["processor"]
            if not pid or (processor is not None and pid != processor) or row["upto"] <= since:
                continue
            body = json.loads(row["record"])
            snap = Snapshot.from_json(body["steps"][-1]["snapshot"])
            for rec in expand(Record(RecordType.DIGEST, snap, -1, body)):
                if (rec.version or -1) > since:
                    out.setdefault(pid, []).append(rec)
        return out


def digest_before_maintenance(queue: Queue) -> int | None:
    """Digest ``queue``'s step commits (when it is some processor's home) before a maintenance
    that drops old log entries by age (``cues queue maintain``): a step commit that no digest
    held would be lost, whoever's it was and however long its processor was idle. Returns the
    version digested up to (None: the queue holds no step record)."""
    if HomeDigests.existing(queue.lake, queue.name) is None:
        found, _ = log_records(queue)
        if not found:
            return None
    return HomeDigests(queue.lake, queue.name).digest(queue)


def processor_history(lake: Lake, processor: str) -> list[Record]:
    """The whole step history of ``processor`` in ``lake`` (its backing queue and every queue)."""
    backing = BackingQueue(lake, processor).records()
    return step_history(backing, [lake.queue(q) for q in lake.list_queues()], processor)
