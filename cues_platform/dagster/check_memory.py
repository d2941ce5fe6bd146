"""A check's memory: how far it judged each partition, and the rows still open.

The ``contract`` and ``outside_protocol`` checks judge what *arrived* in their queue, not what
the latest materialization wrote: every row committed since the previous evaluation (by a step
of this run, by recovery rolling a failed attempt forward, by ``cues run`` outside Dagster, by a
producer appending without a delivery hash), plus the rows a previous evaluation found failing
and nobody has handled yet. Each check's memory is three values of the metadata of its own
latest evaluation in Dagster's event log (so the UI shows them); :func:`plan_window` is the
arithmetic both checks share (what to judge now), :class:`Window` ``.next_memory`` what to
remember after:

- ``cues/judged_to`` ``{partition: offset}``: every row below it was judged by some evaluation;
- ``cues/open_failing`` ``{partition: [[start, end), ...]}``: rows that failed the check (broke
  the contract; were written without a delivery hash) and are neither quarantined nor passing
  now: re-judged every time;
- ``cues/open_unjudged`` ``{partition: [[start, end), ...]}``: rows the queue's retention removed
  before any evaluation judged them (only a quarantine, which acknowledges them, closes them).

Who owns it: the Dagster instance's event log (the check writes it, as the metadata of each
evaluation; nothing else does), kept in the asset check execution records. What deletes it:
wiping the asset (``instance.wipe_assets``, the UI's "Wipe materializations", ``dagster asset
wipe``) or the instance (a new ``DAGSTER_HOME``); deleting runs does not (dagster 1.13 keeps the
check execution records of a deleted run). Then the check reads the newest evaluation still
stored (it walks the history back) and, with none left, starts again from offset 0: it judges
every row still in the queue and keeps the rows retention removed before it as ``open_unjudged``
(never green on rows no check saw). Losing the memory can only make the
check judge more, never less. Two evaluations at once both start from the same memory: each
covers from there, whichever is stored last is the memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cues_platform.errors import CuesError
from cues_platform.queues import Lake
from cues_platform.queues.reader import plan_read

JUDGED_TO = "cues/judged_to"
OPEN_FAILING = "cues/open_failing"
OPEN_UNJUDGED = "cues/open_unjudged"
# not memory: the error queue a quarantine of this check's rows goes to (`cues quarantine` reads it)
ERROR_QUEUE = "cues/error_queue"
# an evaluation keeps at most this many runs per partition: beyond, neighbouring runs are merged
# (a superset: re-judging a passing row again only costs the read, it never hides a failing one)
MAX_RUNS = 200
HISTORY_PAGE = 25

Runs = dict[str, list[list[int]]]  # {partition: [[start, end), ...]} sorted, disjoint, non-empty


class CheckMemoryError(CuesError, ValueError):
    """A stored evaluation's memory cannot be read (its metadata was written by hand or damaged).

    Carries ``check`` and ``run_id``. Not retryable: delete that run's evaluation (``dagster run
    delete RUN_ID``) and the check falls back to the one before it."""

    retryable = False


# -- offset runs ----------------------------------------------------------------------------------
def normalize(runs: Mapping[str, Iterable[Sequence[int]]]) -> Runs:
    """Sorted, merged, non-empty runs per partition (partitions without a run dropped)."""
    out: Runs = {}
    for part, spans in runs.items():
        merged: list[list[int]] = []
        for lo, hi in sorted((int(a), int(b)) for a, b in spans):
            if hi <= lo:
                continue
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        if merged:
            out[str(part)] = merged
    return out


def union(*many: Mapping[str, Iterable[Sequence[int]]]) -> Runs:
    joined: dict[str, list[Sequence[int]]] = {}
    for runs in many:
        for part, spans in runs.items():
            joined.setdefault(str(part), []).extend(spans)
    return normalize(joined)


def subtract(runs: Mapping[str, Iterable[Sequence[int]]], minus: Mapping[str, Iterable[Sequence[int]]]) -> Runs:
    """``runs`` without the offsets of ``minus``."""
    out: dict[str, list[list[int]]] = {}
    cut = normalize(minus)
    for part, spans in normalize(runs).items():
        holes = cut.get(part, [])
        for lo, hi in spans:
            pos = lo
            for a, b in holes:
                if b <= pos or a >= hi:
                    continue
                if a > pos:
                    out.setdefault(part, []).append([pos, a])
                pos = max(pos, b)
            if pos < hi:
                out.setdefault(part, []).append([pos, hi])
    return normalize(out)


def split_below(runs: Mapping[str, Iterable[Sequence[int]]], starts: Mapping[str, int]) -> tuple[Runs, Runs]:
    """(the offsets at or above each partition's start offset, the offsets below it)."""
    below = {p: [[0, int(starts.get(p, 0))]] for p in runs}
    kept = subtract(runs, below)
    return kept, subtract(runs, kept)


def from_offsets(offsets: Mapping[str, Iterable[int]]) -> Runs:
    """Runs of single offsets ``{partition: [offset, ...]}``."""
    return normalize({p: [[o, o + 1] for o in offs] for p, offs in offsets.items()})


def coalesce(runs: Runs, *, max_runs: int = MAX_RUNS) -> Runs:
    """At most ``max_runs`` runs per partition: the closest neighbours merged first (a superset of
    ``runs``, never a subset)."""
    out: Runs = {}
    for part, spans in normalize(runs).items():
        spans = [list(s) for s in spans]
        while len(spans) > max_runs:
            gaps = sorted(range(len(spans) - 1), key=lambda i: spans[i + 1][0] - spans[i][1])
            merge = set(gaps[: len(spans) - max_runs])
            joined: list[list[int]] = []
            for i, span in enumerate(spans):
                if i - 1 in merge:
                    joined[-1][1] = span[1]
                else:
                    joined.append(span)
            spans = joined
        out[part] = spans
    return out


def count(runs: Mapping[str, Iterable[Sequence[int]]]) -> int:
    return sum(hi - lo for spans in normalize(runs).values() for lo, hi in spans)


def describe(runs: Mapping[str, Iterable[Sequence[int]]], *, limit: int = 5) -> str:
    """``0: [3, 4), [9, 12); 1: [0, 2)`` (at most ``limit`` runs per partition shown)."""
    parts = []
    for part, spans in sorted(normalize(runs).items()):
        shown = ", ".join(f"[{lo}, {hi})" for lo, hi in spans[:limit])
        more = f" and {len(spans) - limit} more" if len(spans) > limit else ""
        parts.append(f"{part}: {shown}{more}")
    return "; ".join(parts)


# -- the memory ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckMemory:
    judged_to: dict[str, int] = field(default_factory=dict)
    open_failing: Runs = field(default_factory=dict)
    open_unjudged: Runs = field(default_factory=dict)
    run_id: str | None = None  # the run of the evaluation it was read from (None: no memory)
    # every metadata value of that evaluation (what `cues quarantine list` shows besides the runs)
    evaluation: dict[str, Any] = field(default_factory=dict, compare=False)
    timestamp: float | None = field(default=None, compare=False)  # when it was stored (seconds)

    def metadata(self) -> dict[str, Any]:
        return {JUDGED_TO: dict(sorted(self.judged_to.items())), OPEN_FAILING: self.open_failing,
                OPEN_UNJUDGED: self.open_unjudged}


def memory_of(metadata: Mapping[str, Any], *, run_id: str | None, check: str = "contract",
              timestamp: float | None = None) -> CheckMemory | None:
    """The memory stored in one evaluation's metadata values (None: the evaluation has none, it
    was made by an older version)."""
    if JUDGED_TO not in metadata:
        return None
    try:
        return CheckMemory(
            judged_to={str(p): int(o) for p, o in dict(metadata[JUDGED_TO]).items()},
            open_failing=normalize(dict(metadata.get(OPEN_FAILING) or {})),
            open_unjudged=normalize(dict(metadata.get(OPEN_UNJUDGED) or {})),
            run_id=run_id, evaluation=dict(metadata), timestamp=timestamp)
    except (TypeError, ValueError) as exc:
        raise CheckMemoryError(
            f"the {check!r} evaluation of run {run_id} holds a memory that cannot be read "
            f"({exc}): delete that run (`dagster run delete {run_id}`) and the check falls back "
            "to the evaluation before it", check=check, run_id=run_id) from exc


def load_memory(instance: Any, check_key: Any) -> CheckMemory:
    """The memory of the newest stored evaluation of ``check_key`` that has one (an empty memory
    when none has: judge from offset 0)."""
    from dagster._core.storage.asset_check_execution_record import (
        COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES,
    )

    cursor: int | None = None
    while True:
        records = instance.event_log_storage.get_asset_check_execution_history(
            check_key, limit=HISTORY_PAGE, cursor=cursor, status=COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES)
        for record in records:
            evaluation = record.event.dagster_event.event_specific_data if record.event else None
            metadata = getattr(evaluation, "metadata", None)
            if not metadata:
                continue
            mem = memory_of({k: v.value for k, v in metadata.items()}, run_id=record.run_id,
                            check=check_key.to_user_string(), timestamp=record.create_timestamp)
            if mem is not None:
                return mem
        if len(records) < HISTORY_PAGE:
            return CheckMemory()
        cursor = records[-1].id


# -- what an evaluation judges ---------------------------------------------------------------------
def stable_ends(lake: Lake, queue_name: str, starts: Mapping[str, int]) -> dict[str, int]:
    """Each partition's last stable offset: the end of what a ``read_committed`` reader sees (the
    first row of an undecided transaction, or the next offset)."""
    queue = lake.queue(queue_name)
    return {p: plan_read(queue, partition=p, start=int(starts.get(p, 0)), end=None).end
            for p in queue.partitions}


def intersect(a: Mapping[str, Any], b: Mapping[str, Any]) -> Runs:
    return subtract(a, subtract(a, b))


@dataclass(frozen=True)
class Window:
    """What one evaluation judges, from the memory, the queue and its quarantined rows.

    ``readable``: the rows to judge now (arrived since ``judged_to``, and the open ones, minus the
    quarantined, still in the queue); ``still_failing_removed``: open rows retention removed since
    (they stay open, nothing can pass them now); ``unjudged``: rows retention removed before any
    evaluation judged them, not quarantined."""

    memory: CheckMemory  # the memory it started from (empty when it was not this queue's)
    ends: dict[str, int]
    arrived: Runs
    readable: Runs
    still_failing_removed: Runs
    unjudged: Runs
    closed_by_quarantine: Runs
    notes: list[str]

    def next_memory(self, failing_now: Runs) -> CheckMemory:
        """The memory after judging ``readable``: ``failing_now`` the rows of it that failed."""
        open_failing = coalesce(union(failing_now, self.still_failing_removed))
        judged_to = {p: max(end, self.memory.judged_to.get(p, 0)) for p, end in self.ends.items()}
        return CheckMemory(judged_to=judged_to, open_failing=open_failing, open_unjudged=self.unjudged)


def plan_window(lake: Lake, queue_name: str, *, memory: CheckMemory, quarantined: Runs) -> Window:
    queue = lake.queue(queue_name)
    starts = queue.start_offsets()
    ends = stable_ends(lake, queue_name, starts)
    notes: list[str] = []
    beyond = {p: o for p, o in memory.judged_to.items() if p not in ends or o > queue.next_offset(p)}
    if beyond:  # the memory is not this queue's (re-created under the same asset key)
        notes.append(f"the remembered positions {beyond} are past the queue's end (the queue was "
                     "created again): judged every row still in it")
        memory = CheckMemory()
    arrived = normalize({p: [[min(memory.judged_to.get(p, 0), end), end]] for p, end in ends.items()})
    closed = intersect(union(memory.open_failing, memory.open_unjudged), quarantined)
    window = subtract(union(memory.open_failing, arrived), quarantined)
    readable, removed = split_below(window, starts)
    still_failing_removed = intersect(removed, memory.open_failing)  # failing, then retained away
    unjudged = subtract(union(memory.open_unjudged, subtract(removed, memory.open_failing)), quarantined)
    return Window(memory=memory, ends=ends, arrived=arrived, readable=readable,
                  still_failing_removed=still_failing_removed, unjudged=unjudged,
                  closed_by_quarantine=closed, notes=notes)


__all__ = ["ERROR_QUEUE", "JUDGED_TO", "OPEN_FAILING", "OPEN_UNJUDGED", "CheckMemory", "CheckMemoryError",
           "Runs", "Window", "coalesce", "count", "describe", "from_offsets", "intersect", "load_memory",
           "memory_of", "normalize", "plan_window", "split_below", "stable_ends", "subtract", "union"]
