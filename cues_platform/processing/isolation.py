"""One bad row costs one row: the rows a processor function fails on, found inside the step.

When the function raises a handled error (its own exception, raised on the driver or by a row on
an executor: ``failures.origin_of``) and the processor has an error queue and
``Options.on_error = OnError.ISOLATE`` (the default), the step does not turn into one error row.
It finds the failing input rows and delivers the rest, in the same step:

1. The *isolated input* is chosen from the snapshot alone: the chosen input of an alts; else the
   input with the most offsets in this step (the streaming side of a join; declared order breaks
   ties). Every other input is given whole to every call.
2. The step's range ``[start, end)`` of that input, which failed as a whole, is split in halves;
   the function runs on each half (the input frame filtered to the half's offsets, the other
   inputs whole, ``ctx.inputs`` naming the half) and its result is materialized. A half that
   fails is split again, down to single offsets, halves in offset order. A platform failure in a
   call stops the step as usual (``PlatformStepError``: nothing delivered).
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
failing range is called once), plus one Spark job reading the failing rows' payloads.

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


def isolate(*, binding: str, whole: Range, first: BaseException, call: Call, max_calls: int,
            after_call: Callable[[], None] = lambda: None) -> Isolation:
    """Steps 2 and 3 for the range ``whole`` of ``binding``, which failed with ``first``. A
    platform failure of a call propagates (a ``StepFailure`` of origin platform)."""
    found = Isolation(binding)
    stack: list[tuple[int, int, BaseException]] = [(whole.start, whole.end, first)]
    while stack:
        start, end, cause = stack.pop()
        if end - start == 1:  # a call on exactly this offset failed (or the whole was this one)
            found.failing.append(Failing(start, cause))
            continue
        if found.calls + 2 > max_calls:
            found.failing += [Failing(o, cause, False, (start, end)) for o in range(start, end)]
            continue
        middle = (start + end) // 2
        failed: list[tuple[int, int, BaseException]] = []
        for lo, hi in ((start, middle), (middle, end)):
            found.calls += 1
            try:
                outputs = call(lo, hi)
            except StepFailure as failure:
                if failure.origin is Origin.PLATFORM:
                    raise
                failed.append((lo, hi, failure.cause))
            else:
                found.good.append((lo, outputs))
            after_call()
        stack += reversed(failed)  # the left half first: offset order
    found.failing.sort(key=lambda f: f.offset)
    return found


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
