"""One bad row costs one row: the rows a processor function fails on, found inside the step.

When the function raises a handled error (its own exception, raised on the driver or by a row on
an executor: ``failures.origin_of``) and the processor has an error queue and
``Options.on_error = OnError.ISOLATE`` (the default), the step does not turn into one error row.
It finds the failing input rows and delivers the rest, in the same step:

1. The *isolated input* is chosen from the snapshot alone: the chosen input of an alts; else the
   input with the most offsets in this step (the streaming side of a join; declared order breaks
   ties). Every other input is given whole to every call.
2. The step's range ``[start, end)`` of that input, which failed as a whole, is split in halves
   (``FIRST_SPLIT`` pieces: 2 by default); the function runs on each half (the input frame
   filtered to the half's offsets, the other inputs whole, ``ctx.inputs`` naming the half) and its
   result is materialized. A half that fails is split again, down to single offsets. The search
   goes level by level: the calls of one level run together from up to ``WORKERS`` (4) driver
   threads (Spark takes jobs from several threads; nothing global is set), and their outcomes are
   taken in offset order, so what is found does not depend on which call ends first. The user's
   function may therefore be called from several threads at once during isolation. A platform
   failure in a call stops the step as usual (``PlatformStepError``: nothing delivered), once
   the calls in flight have ended.
3. A row is *failing* only when a call on exactly that one offset failed: never by elimination.
   With the call budget spent (``Options.max_isolation_calls``; by default 32 per halving of
   the step, :func:`call_budget`), the rows of each range still failing get one error
   row each, saying the range was not split further (they are in the error queue, not lost).
4. The results of the halves that succeeded, concatenated in offset order, are the step's output,
   and the failing rows are one error row each (the row as JSON in ``payload``, its one-offset range
   in ``inputs``, the exception of the call on it). Step 3 of the step protocol (contracts,
   conforming) and its commits follow unchanged: ONE commit (or one attempt) carries the good rows
   and the error rows together with the step's delivery hash.

Why nothing is recorded during isolation: every call happens before the step's outcome is fixed
(its one commit, or its attempt record). A crash in the middle of isolation is a crash before
``after_prepare``: nothing of it is visible, and the next start plans the step again and isolates
again (for a deterministic function, the same rows). Each input row ends up, once, either among
the delivered rows or in the error queue, because the step's outcome holds every offset of its
range exactly once (the halves partition it) and is committed as one step. The sub-calls share the
step's ``ctx.step`` and ``ctx.delivery_hash``: they are parts of one step, not steps.

Cost: a step with k failing rows of n makes about ``2 k log2(n / k)`` extra calls (each half of a
failing range is called once), plus one Spark job reading the failing rows' payloads; in wall
time about ``log2 n`` levels, each as long as its calls take ``WORKERS`` at a time. No search
through calls that each say only "this range failed or not" can do with fewer than
``log2 C(n, k)`` calls (about 178 for 10 rows of 1M): docs/benchmarks.md, isolation.

Not isolated (one error row for the step, as ``OnError.WHOLE_STEP``): a sink (its function makes
effects; calling it on halves would make the good halves' effects under the step's hash before the
step's outcome is known, and a retry would call it on other halves), a source and an imperative
processor (no input ranges), and a step of a processor without an error queue (it stops, as
before: nothing to put the rows in).
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa

from cues_platform.processing.backing import Range, Snapshot
from cues_platform.processing.contracts import rows_as_json
from cues_platform.processing.failures import Origin, StepFailure, exception_type_of
from cues_platform.processing.model import Kind, OnError, Processor
from cues_platform.processing.outputs import ERROR_SCHEMA

ISOLATED_KINDS = (Kind.MAP, Kind.JOIN, Kind.ALTS, Kind.FORK)
Outputs = dict[str, pa.Table]  # binding -> the materialized result of one call
Call = Callable[[int, int], Outputs]  # (start, end) of the isolated input -> outputs; raises StepFailure


@dataclass(frozen=True)
class Failing:
    """A failing input offset and the exception of the call that proved it (``isolated``), or of
    the smallest range still failing when the call budget was spent (``isolated`` False)."""

    offset: int
    cause: BaseException
    isolated: bool = True
    within: tuple[int, int] | None = None  # the range, when not isolated


@dataclass
class Isolation:
    binding: str
    good: list[tuple[int, Outputs]] = field(default_factory=list)  # (range start, outputs)
    failing: list[Failing] = field(default_factory=list)
    calls: int = 0

    def outputs(self) -> Outputs:
        """Every succeeding call's outputs concatenated per binding, in offset order."""
        parts: dict[str, list[pa.Table]] = {}
        for _start, out in sorted(self.good, key=lambda g: g[0]):
            for binding, table in out.items():
                parts.setdefault(binding, []).append(table)
        return {b: pa.concat_tables(ts, promote_options="default") for b, ts in parts.items()}


CALLS_PER_HALVING = 32  # the default budget: this many calls per level of halving of the step


def call_budget(max_calls: int | None, size: int) -> int:
    """``Options.max_isolation_calls``, or by default ``32 * ceil(log2 size)``: enough for about
    16 failing rows, and a function that fails on every row stops after as many calls."""
    if max_calls is not None:
        return max_calls
    return CALLS_PER_HALVING * max(1, math.ceil(math.log2(max(2, size))))


def isolated_input(processor: Processor, snapshot: Snapshot, *, error_queue: str | None) -> str | None:
    """Step 1: the binding isolation splits, or None where the step is not isolated."""
    if (not error_queue or processor.options.on_error is not OnError.ISOLATE
            or processor.kind not in ISOLATED_KINDS):
        return None
    if snapshot.alts is not None:
        return snapshot.alts if snapshot.inputs[snapshot.alts].size else None
    order = list(snapshot.inputs)
    best = max(order, key=lambda b: (snapshot.inputs[b].size, -order.index(b)), default=None)
    return best if best is not None and snapshot.inputs[best].size else None


WORKERS = 4  # calls of one level of the search at once (threads of the driver), at most
FIRST_SPLIT = 2  # pieces the failing step is first split into (then halves)


def isolate(*, binding: str, whole: Range, first: BaseException, call: Call, max_calls: int,
            after_call: Callable[[], None] = lambda: None, workers: int | None = None,
            first_split: int | None = None) -> Isolation:
    """Steps 2 and 3 for the range ``whole`` of ``binding``, which failed with ``first``. A
    platform failure of a call propagates (a ``StepFailure`` of origin platform), after every
    call in flight has ended.

    The search goes level by level: every range still failing at one level is split (the step in
    ``first_split`` pieces, then each range in halves) and all the pieces of the level are called
    together, ``workers`` at a time (``call`` and the function it calls must accept calls from
    several threads; ``workers=1``: one after another, on this thread). The results are taken in
    offset order, whatever the order the calls end in, so what is found (the failing offsets, the
    outputs and their order, the calls made) follows from the calls' outcomes alone. ``after_call``
    is called on this thread once per call, in offset order, as soon as that call and the ones
    before it have ended. The budget is spent level by level, ranges in offset order: a range
    whose pieces no longer fit is not split, its rows are failing but not isolated."""
    workers = WORKERS if workers is None else workers
    width = FIRST_SPLIT if first_split is None else first_split
    if workers < 1 or width < 2:
        raise ValueError(f"isolate: workers must be >= 1 and first_split >= 2 (got workers={workers}, "
                         f"first_split={width}): pass values in those bounds, or None for the defaults")
    found = Isolation(binding)
    level: list[tuple[int, int, BaseException]] = [(whole.start, whole.end, first)]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cues-isolate") if workers > 1 else None
    try:
        while level:
            pieces: list[tuple[int, int]] = []
            for start, end, cause in level:  # offset order
                if end - start == 1:  # a call on exactly this offset failed (or the whole was this one)
                    found.failing.append(Failing(start, cause))
                    continue
                # the first split narrows to what the budget still allows (halves at least)
                split = _split(start, end, max(2, min(width, max_calls - found.calls)))
                if found.calls + len(split) > max_calls:
                    found.failing += [Failing(o, cause, False, (start, end)) for o in range(start, end)]
                    continue
                found.calls += len(split)
                pieces += split
            level = []
            for (lo, hi), outcome in zip(pieces, _called(pool, call, pieces, after_call), strict=True):
                if isinstance(outcome, BaseException):
                    level.append((lo, hi, outcome))
                else:
                    found.good.append((lo, outcome))
            width = 2
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    found.failing.sort(key=lambda f: f.offset)
    found.good.sort(key=lambda g: g[0])
    return found


def _split(start: int, end: int, width: int) -> list[tuple[int, int]]:
    """``[start, end)`` in ``min(width, end - start)`` contiguous pieces, in offset order (halves:
    the middle is ``(start + end) // 2``, as it always was)."""
    count = min(width, end - start)
    bounds = [start + (end - start) * i // count for i in range(count + 1)]
    if count == 2:
        bounds[1] = (start + end) // 2
    return list(zip(bounds, bounds[1:], strict=False))


def _called(pool: ThreadPoolExecutor | None, call: Call, pieces: list[tuple[int, int]],
            after_call: Callable[[], None]) -> list[Outputs | BaseException]:
    """Each piece's outputs, or the handled exception of its call, in the pieces' order. A
    platform failure (or any other exception) of the first piece in order that has one is raised,
    once every call in flight has ended and the calls not yet started are cancelled."""

    def one(lo: int, hi: int) -> Outputs | BaseException:
        try:
            return call(lo, hi)
        except StepFailure as failure:
            if failure.origin is Origin.PLATFORM:
                raise
            return failure.cause

    if pool is None:
        results = []
        for lo, hi in pieces:
            results.append(one(lo, hi))
            after_call()
        return results
    futures = [pool.submit(one, lo, hi) for lo, hi in pieces]
    try:
        results = []
        for future in futures:  # offset order, whatever order they end in
            results.append(future.result())
            after_call()
        return results
    finally:  # on a raise: nothing left running behind the caller's back
        for future in futures:
            future.cancel()
        wait(futures)


def error_rows(snapshot: Snapshot, found: Isolation, payloads: Mapping[int, str],
               *, max_calls: int) -> pa.Table:
    """Step 4: one error row per failing input row (``payloads``: offset -> the row as JSON; an
    offset without a row, e.g. of an aborted transaction, has none)."""
    whole = snapshot.inputs[found.binding]
    rows: dict[str, list] = {name: [] for name in ERROR_SCHEMA.names}
    now = datetime.now(UTC)
    for f in found.failing:
        ranges = {b: [r.queue, r.partition, r.start, r.end] for b, r in snapshot.inputs.items()}
        ranges[found.binding] = [whole.queue, whole.partition, f.offset, f.offset + 1]
        message = str(f.cause)[:10_000]
        if not f.isolated and f.within is not None:
            message = (f"not isolated further (max_isolation_calls = {max_calls} spent): offsets "
                       f"[{f.within[0]}, {f.within[1]}) of {whole.queue}/{whole.partition} failed "
                       f"together with: {message}")
        rows["processor"].append(snapshot.processor)
        rows["step"].append(snapshot.step)
        rows["inputs"].append(json.dumps(ranges))
        rows["exception_type"].append(exception_type_of(f.cause))
        rows["message"].append(message)
        rows["traceback"].append("".join(traceback.format_exception(f.cause))[-20_000:])
        rows["failed_at"].append(now)
        rows["queue"].append(None)
        rows["payload"].append(payloads.get(f.offset))
    return pa.table(rows, schema=ERROR_SCHEMA)


def payloads_of(table: pa.Table, *, offset_column: str, drop: tuple[str, ...]) -> dict[int, str]:
    """The failing rows as JSON by offset (``table``: the isolated input's failing rows)."""
    offsets = table.column(offset_column).to_pylist()
    payload = table.drop_columns([c for c in table.column_names if c in drop])
    return dict(zip(offsets, rows_as_json(payload), strict=True))


__all__ = ["CALLS_PER_HALVING", "ISOLATED_KINDS", "call_budget", "Failing", "Isolation", "error_rows", "isolate", "isolated_input",
           "payloads_of"]
