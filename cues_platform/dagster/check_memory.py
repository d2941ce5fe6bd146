"""The contract check's memory: how far it judged each partition, and the rows still open.

A ``contract`` check judges what *arrived* in its queue, not what the latest materialization
wrote: every row committed since the previous evaluation (by a step of this run, by recovery
rolling a failed attempt forward, by ``cues run`` outside Dagster), plus the rows a previous
evaluation found failing and nobody has handled yet. Its memory is three values of the
metadata of its own latest evaluation in Dagster's event log (so the UI shows them):

- ``cues/judged_to`` ``{partition: offset}``: every row below it was judged by some evaluation;
- ``cues/open_failing`` ``{partition: [[start, end), ...]}``: rows that broke the contract and
  are neither quarantined nor passing under the contract as it is now: re-judged every time;
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

JUDGED_TO = "cues/judged_to"
OPEN_FAILING = "cues/open_failing"
OPEN_UNJUDGED = "cues/open_unjudged"
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

    def metadata(self) -> dict[str, Any]:
        return {JUDGED_TO: dict(sorted(self.judged_to.items())), OPEN_FAILING: self.open_failing,
                OPEN_UNJUDGED: self.open_unjudged}


def memory_of(metadata: Mapping[str, Any], *, run_id: str | None, check: str = "contract") -> CheckMemory | None:
    """The memory stored in one evaluation's metadata values (None: the evaluation has none, it
    was made by an older version)."""
    if JUDGED_TO not in metadata:
        return None
    try:
        return CheckMemory(
            judged_to={str(p): int(o) for p, o in dict(metadata[JUDGED_TO]).items()},
            open_failing=normalize(dict(metadata.get(OPEN_FAILING) or {})),
            open_unjudged=normalize(dict(metadata.get(OPEN_UNJUDGED) or {})),
            run_id=run_id)
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
                            check=check_key.to_user_string())
            if mem is not None:
                return mem
        if len(records) < HISTORY_PAGE:
            return CheckMemory()
        cursor = records[-1].id


__all__ = ["JUDGED_TO", "OPEN_FAILING", "OPEN_UNJUDGED", "CheckMemory", "CheckMemoryError", "Runs",
           "coalesce", "count", "describe", "from_offsets", "load_memory", "memory_of", "normalize",
           "split_below", "subtract", "union"]
