"""Message retention: a queue's policy, a partition's start offset, and the delete below it.

A queue keeps every row until its policy (table properties ``cues.retention.ms`` and
``cues.retention.bytes``, Kafka's two knobs; unset = keep for ever) says a row may go *and* every
reader that still needs it has read it. Who still needs what is decided one layer up
(``processing/retention.py``: processor lanes, tailers, open transactions); this module holds the
mechanics, which know nothing of readers:

1. A partition's *start offset* is the app transaction ``start:{partition}`` of the queue (0 when
   absent). Offsets stay dense and are never reused: rows ``[start, next offset)`` are all there;
   rows below ``start`` were removed on purpose. A read below it raises
   :class:`OffsetOutOfRangeError` (``reader.py``) instead of returning a silent gap.
2. :func:`cuts` turns the policy into a wanted start per partition: the first offset whose row is
   younger than ``now - ms`` (rows in offset order; an older row after a younger one stays) and/or
   the first offset that keeps the partition's files within ``bytes`` (whole files, oldest first,
   as Kafka deletes whole segments). Either knob may move the start; the larger cut wins.
3. :func:`delete_below` removes the rows below each partition's cut and sets ``start:{partition}``
   in ONE Delta commit (a row-level delete: whole files go, a file straddling the cut is rewritten
   with its rows above it), so no reader ever sees rows gone without the start moved, or the start
   moved with rows below it still there. The start never moves back: a cut at or below the
   current start changes nothing.

On abort (a crash, a lost commit race): nothing changed, or everything did (one commit). The
files the delete removed stay on disk, referenced by older snapshots, until vacuum's retention
passes (``maintenance.py``), so a reader holding an older snapshot keeps reading them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc
from deltalake import CommitProperties, Transaction
from deltalake.exceptions import CommitFailedError

from cues_platform.errors import ConfigurationError
from cues_platform.queues.based import file_bases
from cues_platform.queues.errors import ConcurrentAppendError
from cues_platform.queues.faults import translated
from cues_platform.queues.layout import (
    COMMIT_HOOKS,
    RETENTION_BYTES_KEY,
    RETENTION_KEY,
    RETENTION_MS_KEY,
    START,
)
from cues_platform.queues.reader import read_files
from cues_platform.queues.schema import APPEND_TIME, BASE, OFFSET, PARTITION

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from cues_platform.queues.handle import QueueHandle

# the commit metadata of a retention delete ({partition: [old start, new start]}), read by the
# log checks (integrity.py)
RETENTION_METADATA_KEY = RETENTION_KEY
DELETE_COMMIT_RETRIES = 100  # appenders commit all the time (as compaction)
UNLIMITED = -1  # Kafka's value for "no limit"


@dataclass(frozen=True)
class RetentionPolicy:
    """How long (``ms``) and how much (``bytes``, per partition) a queue keeps; None = no limit."""

    ms: int | None = None
    bytes: int | None = None

    @property
    def enabled(self) -> bool:
        return self.ms is not None or self.bytes is not None

    def describe(self) -> str:
        if not self.enabled:
            return "keep every message (no retention)"
        parts = []
        if self.ms is not None:
            parts.append(f"{self.ms} ms ({self.ms / 86_400_000:g} days)")
        if self.bytes is not None:
            parts.append(f"{self.bytes} bytes per partition")
        return " and ".join(parts) + ", never past what a reader still needs"


def _limit(queue: str, key: str, value: Any) -> int | None:
    if value is None or value == UNLIMITED or value == str(UNLIMITED):
        return None
    number: Any = value
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            number = value
    if isinstance(number, bool) or not isinstance(number, int) or number < 0:
        raise ConfigurationError(
            f"queue {queue!r}: {key} must be a whole number >= 0 (or {UNLIMITED} for no limit), "
            f"got {value!r}; set it again with `cues queue retention {queue} ...`",
            queue=queue, key=key, value=value)
    return number


def policy_of(queue: QueueHandle, *, snapshot: DeltaTable | None = None) -> RetentionPolicy:
    """The queue's retention policy, from its table properties."""
    config = (snapshot or queue.refresh()).metadata().configuration
    return RetentionPolicy(ms=_limit(queue.name, RETENTION_MS_KEY, config.get(RETENTION_MS_KEY)),
                           bytes=_limit(queue.name, RETENTION_BYTES_KEY,
                                        config.get(RETENTION_BYTES_KEY)))


def set_policy(queue: QueueHandle, *, ms: int | None, bytes: int | None) -> RetentionPolicy:
    """Set both knobs (None: no limit) as table properties in one commit; returns the policy."""
    wanted = RetentionPolicy(ms=_limit(queue.name, RETENTION_MS_KEY, ms),
                             bytes=_limit(queue.name, RETENTION_BYTES_KEY, bytes))
    values = {RETENTION_MS_KEY: str(UNLIMITED if wanted.ms is None else wanted.ms),
              RETENTION_BYTES_KEY: str(UNLIMITED if wanted.bytes is None else wanted.bytes)}
    with translated(table=f"queue {queue.name!r}", uri=queue.uri, during="retention policy"):
        queue.refresh().alter.set_table_properties(values, raise_if_not_exists=False)
    return policy_of(queue)


def start_offset(queue: QueueHandle, partition: str, *, snapshot: DeltaTable | None = None) -> int:
    """The first offset of ``partition`` still in the queue (0 until retention removed rows)."""
    version = queue.txn_version(START.id(partition), snapshot=snapshot)
    return 0 if version is None else int(version)


def start_offsets(queue: QueueHandle, *, snapshot: DeltaTable | None = None) -> dict[str, int]:
    dt = snapshot or queue.refresh()
    return {p: start_offset(queue, p, snapshot=dt) for p in queue.partitions}


def _time_cut(queue: QueueHandle, dt: DeltaTable, partition: str, *, start: int, end: int,
              before_ms: int) -> int:
    """The first offset in ``[start, end)`` whose row was appended at or after ``before_ms``
    (``end`` when every row there is older)."""
    files = queue.files(partition=partition, snapshot=dt, start=start, end=end)
    if not files:
        return start
    rows = read_files(queue, files, start=start, end=end, columns=[OFFSET, APPEND_TIME])
    young = rows.filter(pc.greater_equal(pc.cast(rows[APPEND_TIME], "int64"), before_ms * 1000))
    return end if young.num_rows == 0 else int(pc.min(young[OFFSET]).as_py())


def _size_cut(queue: QueueHandle, dt: DeltaTable, partition: str, *, start: int, max_bytes: int) -> int:
    """The offset above which the partition's files hold at most ``max_bytes`` (whole files,
    oldest first)."""
    with queue._lock:
        actions = queue.cache.add_actions(dt)
    if actions.num_rows == 0:
        return start
    actions = actions.filter(pc.equal(actions[f"partition.{PARTITION}"], partition))
    highs = pc.add(actions[f"max.{OFFSET}"], file_bases(actions))  # absolute (based.py)
    files = sorted(zip(highs.to_pylist(), actions["size_bytes"].to_pylist(), strict=True))
    total, cut = sum(size for _, size in files), start
    for last, size in files:
        if total <= max_bytes:
            break
        total -= size
        cut = max(cut, int(last) + 1)
    return cut


def cuts(queue: QueueHandle, policy: RetentionPolicy, *, now_ms: int,
         snapshot: DeltaTable | None = None, below: dict[str, int] | None = None) -> dict[str, int]:
    """Step 2: the start each partition's policy wants, never past ``below[partition]`` (what
    readers still need; default the next offset) and never before the current start."""
    dt = snapshot or queue.refresh()
    out: dict[str, int] = {}
    for p in queue.partitions:
        first = start_offset(queue, p, snapshot=dt)
        end = queue.next_offset(p, snapshot=dt)
        if below is not None:
            end = min(end, below.get(p, first))
        cut = first
        if policy.ms is not None and end > first:
            cut = max(cut, _time_cut(queue, dt, p, start=first, end=end,
                                     before_ms=now_ms - policy.ms))
        if policy.bytes is not None:
            cut = max(cut, _size_cut(queue, dt, p, start=first, max_bytes=policy.bytes))
        out[p] = max(first, min(cut, end))
    return out


@dataclass(frozen=True)
class Deleted:
    partition: str
    old_start: int
    new_start: int
    rows: int  # rows the delete removed (Delta's count; rows of aborted transactions included)


def delete_below(queue: QueueHandle, wanted: dict[str, int]) -> list[Deleted]:
    """Step 3: one commit that removes every row below ``wanted[partition]`` and moves each
    partition's start there. Partitions whose start would not move are left out; nothing to do =
    no commit. A cut past a partition's next offset is a caller's bug and raises."""
    with queue.writing() as dt:  # this handle's other threads wait (one maintainer per queue)
        moves: dict[str, tuple[int, int]] = {}
        for p, cut in wanted.items():
            queue.check_partition(p)
            first = start_offset(queue, p, snapshot=dt)
            end = queue.next_offset(p, snapshot=dt)
            if cut > end:
                raise ConfigurationError(
                    f"queue {queue.name!r}: cannot move the start of partition {p!r} to {cut}, "
                    f"past its next offset {end}", queue=queue.name, partition=p, offset=cut)
            if cut > first:
                moves[p] = (first, int(cut))
        if not moves:
            return []
        # a row's offset is _base + _offset in a queue with based offsets (based.py)
        offset = f"({BASE} + {OFFSET})" if queue.based else OFFSET
        predicate = " OR ".join(f"({PARTITION} = '{p}' AND {offset} < {cut})"
                                for p, (_, cut) in sorted(moves.items()))
        props = CommitProperties(
            app_transactions=[Transaction(START.id(p), cut) for p, (_, cut) in moves.items()],
            custom_metadata={RETENTION_METADATA_KEY: json.dumps(
                {p: [old, cut] for p, (old, cut) in moves.items()}, sort_keys=True)},
            # appends commit all the time; a rebase over them is safe (their rows are above the
            # cut), and a concurrent delete of the same files is a conflict delta-rs refuses
            max_commit_retries=DELETE_COMMIT_RETRIES)
        try:
            with translated(table=f"queue {queue.name!r}", uri=queue.uri, during="retention"):
                metrics = dt.delete(predicate, commit_properties=props,
                                    post_commithook_properties=COMMIT_HOOKS)
        except CommitFailedError as exc:
            raise ConcurrentAppendError(
                f"queue {queue.name!r}: retention lost its commit race ({exc}); nothing was "
                "removed, run maintenance again", queue=queue.name, retryable=True) from exc
    queue.refresh()
    total = int(metrics.get("num_deleted_rows", 0))
    return [Deleted(p, old, cut, total if len(moves) == 1 else -1)
            for p, (old, cut) in sorted(moves.items())]
