"""The exactly-once step protocol and its recovery (seed 004 adapted to batches on Delta).

A processor's *home* queue is the queue of its first output (``processing/home.py``); a sink has
none. Persistence, on every step (``ExactlyOnceStepper.step``):

1. Snapshot: plan the input ranges ``[start, end)`` of this step from the positions (for alts:
   the binding chosen). A sink, or a processor with ``Options(snapshot_at=SnapshotAt.READ)``,
   appends the snapshot to its backing queue here (its side effect happens inside the function,
   before any other record, and a retry must see the same snapshot and hash); every other
   processor records nothing yet.
2. Read the ranges as Spark DataFrames and run the function. Who failed is decided where the
   exception escapes (:func:`cues_platform.processing.failures.origin_of`): only the user's own
   exceptions (and contract breaks in step 3) are *handled*. With an error queue the step is
   isolated to its failing rows (``processing/isolation.py``, ``Options.on_error``): the function
   runs again on halves of the input until the failing rows are found, the other rows' results
   are the step's output and each failing row becomes one error row (``OnError.WHOLE_STEP`` and a
   sink: the step's output is one error row); without an error queue they stop the processor
   (:class:`UnhandledStepError`). Isolation records nothing: a crash during it is a crash before
   ``after_prepare``.
   A platform failure (Delta, the file system, Py4J/Spark infrastructure, a missing input file)
   is never handled: :class:`PlatformStepError` stops the processor, nothing is delivered, no
   error row is written, and the next start plans again from the same positions.
3. Prepare: materialize the result once (Spark is lazy: the user's plan runs here, so a failure
   is classified as in step 2), drop the queues' reserved metadata columns that the input frames
   carried (``_offset``, ``_delivery_hash``...), conform it to the output contracts, in memory.
   An output the executors write (``Options.output_writer``, ``processing/executor_output.py``)
   is instead written by Spark as Parquet files inside its queue's folder, with its offsets; the
   driver keeps only their footers and step 4 commits them by reference.
4. One commit, when every prepared row goes to the home queue (map, join, alts, a fork whose
   other outputs are empty this step; a nil step): commit the rows (or none) to the home queue
   with the delivery hash in their rows, the app transactions ``proc:{p} = step``,
   ``pos:{p}:{queue}/{partition} = end`` and ``epoch:{p}``, and the snapshot in the commit metadata. That
   commit IS the step: before it nothing is recorded, after it the step is delivered.
   Otherwise (outputs and errors in several queues, a fork, a sink): stage the prepared tables
   as files and append ONE attempt record to the backing queue, the snapshot folded into it (a
   sink's attempt follows its snapshot record). From here on the step's outcome is fixed:
   recovery rolls it forward, never recomputes it, so a fork's outputs end all delivered even
   with a non-deterministic function.
5. Attempt path only: commit each output queue other than home in one Delta commit carrying the
   delivery hash in its rows and ``proc:{p} = step`` (a queue that already has the step is
   skipped), then the home queue LAST, as in step 4 (rows or empty). The home commit closes the
   step: when the home has step n, every queue of step n has it.
6. Advance to the snapshot's ends; the next step starts there. Every
   ``Options.backing_maintenance_every`` steps, append one digest record to the backing queue
   holding the one-commit steps' records read back from the home queue's log (Delta trims that
   log after its retention; the auditor needs them, recovery does not), then trim the home's
   log below the second-newest checkpoint that digests cover (:func:`home.trim_home_log`: on a
   local disk delta-rs lists the whole log on every commit and open, so an untrimmed log makes
   every step and every recovery slower for 30 days), drop expired entries (no commit cleans
   them by itself) and compact the backing queue (no record changes).

Crash safety, point by point (names are the hook points the crash matrix crashes at):

- ``before_snapshot``/``after_snapshot``/``after_read``/``after_function``/``after_prepare``
  (one-commit path): nothing is recorded; recovery finds the home at step n-1 with the positions
  of step n-1 and plans step n again from the same starts (with new data its ranges may be
  longer, so its hash may differ: nothing of the crashed attempt was ever visible).
  Files the executors wrote are in no snapshot: orphans that vacuum removes, never read.
- ``after_commit`` (one-commit path): the home has step n with its positions; recovery resumes
  at n+1. The commit is atomic, so no state lies between "rows visible" and "positions stored".
- ``after_prepare`` (attempt path): files may be staged but no record names them: recovery plans
  again; re-planned with the same hash, the step stages under new unique names in the same
  folder, removed on delivery (with a new hash the old folder is left behind, never read).
- ``after_attempt``/``between_commits``: the backing's last record is an attempt of step n above
  the home's step: recovery commits what each queue lacks (``proc:{p}`` says which), the home last.
- ``after_commit`` (attempt path): the home has step n = the attempt's step: delivered; recovery
  removes leftover staged files and resumes at n+1.
- a sink's (or a ``snapshot_at=read`` processor's) ``after_snapshot``..``after_prepare``: the
  backing's last record is its snapshot, above the home's step: recovery retries the same ranges
  with the same hash (the sink helpers skip effects already made under that hash). After its
  home commit the snapshot's step equals the home's: delivered.

Recovery, once on start (``recover``), reads only the home queue's app transactions and the last
backing record (O(1) in history). It begins by fencing: a new epoch is committed to the backing
queue and then to the home queue, so every older instance's next backing append or home commit
fails (a zombie's step commit racing the fence conflicts on ``epoch:{p}`` and is refused). A
zombie can therefore finish at most a step it committed before the new instance read the home
queue, which the new instance then sees. Recovery is idempotent: a crash inside it is recovered
from by the next start.

Off by one: ``step`` numbers from 0; ``proc:{processor}`` holds the last *delivered* step, so a
queue has step n iff its version >= n. ``pos:{p}:{queue}/{partition}`` holds the next offset to
read in that queue partition (keyed by what was read, never by the binding's name).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from cues_platform.processing.backing import (
    BackingOf,
    Range,
    Record,
    RecordType,
    Snapshot,
    open_backing,
)
from cues_platform.processing.batching import step_size
from cues_platform.processing.context import StepContext
from cues_platform.processing.contracts import checked_in_step, split_by_contract
from cues_platform.processing.errors import (
    PlatformStepError,
    ProcessorFencedError,
    RecoveryError,
    StepInFlightError,
    UnhandledStepError,
)
from cues_platform.processing.executor_output import executor_output, write_by_executors
from cues_platform.processing.failures import Origin, Phase, StepFailure, failing_as, qualified_name
from cues_platform.processing.graph import Graph
from cues_platform.processing.history import HomeDigests, processor_history
from cues_platform.processing.home import (
    FENCE_ATTEMPTS,
    HomeState,
    commit_step,
    fence_home,
    home_guard,
    home_of,
    migrate_legacy_positions,
    read_home,
    trim_home_log,
)
from cues_platform.processing.inputs import read_input, rows_at, rows_between
from cues_platform.processing.isolation import (
    call_budget,
    error_rows,
    isolate,
    isolated_input,
    payloads_of,
)
from cues_platform.processing.model import Kind, Processor, SnapshotAt
from cues_platform.processing.outputs import (
    commit_staged,
    conformed,
    contract_error_table,
    delivered_to,
    error_table,
    partitioned,
    read_staged,
    remove_staging,
    split_outputs,
    stage,
    to_arrow,
)
from cues_platform.queues import Lake, Queue
from cues_platform.queues.by_reference import WrittenPart
from cues_platform.queues.errors import SchemaError
from cues_platform.queues.reader import ReadPlan, plan_read
from cues_platform.queues.schema import OFFSET, RESERVED

Hook = Callable[[str], None]


def without_metadata(table: pa.Table) -> pa.Table:
    """Drop the queues' reserved metadata columns (the input frames carry them; a function that
    adds a column to its input returns them too). Other ``_`` names still break the contract."""
    reserved = [c for c in table.column_names if c in RESERVED]
    return table.drop_columns(reserved) if reserved else table


@dataclass(frozen=True)
class StepResult:
    step: int
    delivery_hash: str
    outcome: str  # "output" | "error" | "nil"
    inputs: Mapping[str, Range]
    rows_in: int
    rows_out: Mapping[str, int] = field(default_factory=dict)
    error: str | None = None
    recovered: bool = False


class StepBase:
    """Shared by every strategy: the graph, queues, input planning and running the function."""

    def __init__(self, *, graph: Graph, processor: Processor, lake: Lake, spark: Any = None,
                 resources: Mapping[str, Any] | None = None, hook: Hook | None = None,
                 backing_of: BackingOf | None = None) -> None:
        self.graph, self.processor, self.lake, self.spark = graph, processor, lake, spark
        # the one way a step reaches a backing queue (the Dagster ``backing`` resource, or the lake's)
        self.backing_of: BackingOf = backing_of or open_backing(lake)
        self.resources = dict(resources or {})
        self.hook: Hook = hook or (lambda _point: None)
        names = {b.queue for b in [*processor.inputs.values(), *processor.outputs.values()]}
        self.error_queue_name = graph.error_queue_of(processor)
        if self.error_queue_name:
            names.add(self.error_queue_name)
        self.queues: dict[str, Queue] = {n: lake.queue(n) for n in names}
        self.positions: dict[str, int] = dict.fromkeys(processor.inputs, 0)
        self.next_step = 0
        self._alts_cursor = 0
        self._host_context: Any = None  # the context a host passed to call()
        # Step 1's read plans of the snapshot it just planned, by binding: step 2 reads them
        # instead of planning the same ranges again (once: a retry or isolation plans afresh)
        self._planned: tuple[Snapshot, dict[str, ReadPlan]] | None = None

    def first_offset(self, binding: str) -> int:
        """Where a lane that never read its queue partition starts: the partition's start offset
        (0 until retention removed rows before this lane existed)."""
        src = self.processor.inputs[binding]
        return self.queues[src.queue].start_offset(src.partition)

    def plan_snapshot(self) -> Snapshot | None:
        """Ranges for the next step from the current positions, or None when there is no work."""
        self._planned = None
        ranges, plans = {}, {}
        for binding, src in self.processor.inputs.items():
            start = self.positions[binding]
            queue = self.queues[src.queue]
            size = step_size(self.processor.options, start=start,
                             available=queue.next_offset(src.partition))
            plans[binding] = plan_read(queue, partition=src.partition, start=start, end=start + size)
            ranges[binding] = Range(src.queue, src.partition, start, plans[binding].end)
        alts = None
        if self.processor.kind is Kind.ALTS:
            order = list(ranges)
            order = order[self._alts_cursor:] + order[:self._alts_cursor]
            alts = next((b for b in order if ranges[b].size), None)
            if alts is None:
                return None
            self._alts_cursor = (list(ranges).index(alts) + 1) % len(ranges)
            ranges = {b: r if b == alts else Range(r.queue, r.partition, r.start, r.start)
                      for b, r in ranges.items()}
        elif not ranges or not all(r.size for r in ranges.values()):
            return None  # map/fork/sink/join wait until every input has data
        snapshot = Snapshot(self.processor.id, self.next_step, ranges, alts)
        self._planned = (snapshot, {b: plans[b] for b, r in ranges.items() if r.end == plans[b].end})
        return snapshot

    def context(self, snapshot: Snapshot) -> StepContext:
        return StepContext(self.processor.id, snapshot.step, snapshot.delivery_hash, self.processor.options,
                           self.lake, self.spark, self.resources, dict(snapshot.inputs))

    def read_frames(self, snapshot: Snapshot) -> dict[str, Any]:
        """Step 2, first half: the snapshot's ranges as Spark DataFrames (lazy)."""
        frames = self._frames(snapshot)
        self.hook("after_read")
        return frames

    def _frames(self, snapshot: Snapshot) -> dict[str, Any]:
        read_as = self.processor.options.read_as
        planned, self._planned = self._planned, None
        # the plans step 1 made of exactly these ranges, moments ago (a queue is append-only: a
        # newer snapshot holds the same rows there; a compacted file stays until vacuum, as for
        # any lazy read); a recovered or retried snapshot is planned again
        plans = planned[1] if planned is not None and planned[0] is snapshot else {}
        with failing_as(Phase.READ):
            frames = {}
            for binding, r in snapshot.inputs.items():
                plan = plans.get(binding) or plan_read(self.queues[r.queue], partition=r.partition,
                                                       start=r.start, end=r.end)
                frames[binding] = read_input(self.queues[r.queue], plan, read_as=read_as, spark=self.spark)
        return frames

    def call(self, snapshot: Snapshot, frames: Mapping[str, Any], context: Any = None) -> Any:
        """Step 2, second half: the processor function on the frames (``context``: what the
        function gets as its first argument; default the step's :class:`StepContext`)."""
        if context is not None:
            self._host_context = context  # what isolation's calls get too (processing/isolation.py)
        return self._call_fn(self.context(snapshot) if context is None else context, frames)

    def _call_fn(self, context: Any, frames: Mapping[str, Any]) -> Any:
        with failing_as(Phase.FUNCTION):
            return self.processor.fn(context, **frames)

    def run_function(self, snapshot: Snapshot) -> Any:
        return self.call(snapshot, self.read_frames(snapshot))

    def run_and_prepare(self, snapshot: Snapshot) -> tuple[dict, dict, Exception | None]:
        """Steps 2 and 3: ``(staged, counts, None)``, or a handled failure staged as its error
        rows ``(staged, counts, exc)``. A platform failure raises :class:`PlatformStepError`."""
        try:
            result = self.run_function(snapshot)
        except StepFailure as failure:
            return self.prepared(snapshot, failure=failure)
        self.hook("after_function")
        return self.prepared(snapshot, result=result)

    def prepared(self, snapshot: Snapshot, *, result: Any = None,
                 failure: StepFailure | None = None) -> tuple[dict, dict, Exception | None]:
        """Step 3 on the function's ``result``, or on the ``failure`` that escaped step 2."""
        if failure is None:
            try:
                staged, counts = self.prepare(snapshot, result)
                return staged, counts, None
            except StepFailure as escaped:
                failure = escaped
        if failure.origin is Origin.PLATFORM:
            raise self.platform_error(snapshot, failure) from failure.cause
        isolated = self.isolated(snapshot, failure.cause)
        if isolated is not None:
            return isolated
        staged, counts = self.handled(snapshot, failure.cause)
        return staged, counts, failure.cause

    def isolated(self, snapshot: Snapshot, cause: Exception) -> tuple[dict, dict, Exception | None] | None:
        """A handled failure of the whole step, isolated to its failing rows
        (``processing/isolation.py``): ``(staged, counts, None)`` when some row was delivered,
        ``(staged, counts, cause)`` when every row failed; None where the step is not isolated."""
        binding = isolated_input(self.processor, snapshot, error_queue=self.error_queue_name)
        if binding is None:
            return None
        options = self.processor.options
        try:
            frames = self._frames(snapshot)
            host = self._host_context  # a host's context of THIS step (Dagster's), else the step's
            base = host if getattr(host, "step", None) == snapshot.step else self.context(snapshot)
            whole = snapshot.inputs[binding]

            def call(start: int, end: int) -> dict[str, pa.Table]:
                part = Range(whole.queue, whole.partition, start, end)
                ctx = dataclasses.replace(base, inputs={**snapshot.inputs, binding: part})
                sub = {**frames, binding: rows_between(frames[binding], start, end)}
                result = self._call_fn(ctx, sub)
                with failing_as(Phase.MATERIALIZE):
                    out = split_outputs(result, self.processor.outputs, processor=self.processor.id)
                    return {b: without_metadata(to_arrow(v)) for b, v in out.items()}

            budget = call_budget(options.max_isolation_calls, whole.size)
            found = isolate(binding=binding, whole=whole, first=cause, call=call, max_calls=budget,
                            after_call=lambda: self.hook("after_isolation_call"),
                            workers=options.isolation_workers)
            payloads: dict[int, str] = {}
            if found.failing:  # the failing rows themselves (one Spark job), for their error rows
                with failing_as(Phase.READ):
                    bad = rows_at(frames[binding], [f.offset for f in found.failing])
                payloads = payloads_of(bad, offset_column=OFFSET, drop=tuple(RESERVED))
        except StepFailure as failure:  # a platform failure (isolate re-raises only those)
            raise self.platform_error(snapshot, failure) from failure.cause
        errors = error_rows(snapshot, found, payloads, max_calls=budget)
        try:
            with failing_as(Phase.STAGE):
                tables = self._output_tables(snapshot, found.outputs())
                mine = tables.setdefault(self.error_queue_name, {})
                mine["0"] = pa.concat_tables([mine["0"], errors]) if "0" in mine else errors
                staged, counts = self.keep(snapshot, tables)
        except StepFailure as failure:
            if failure.origin is Origin.PLATFORM:
                raise self.platform_error(snapshot, failure) from failure.cause
            # the good rows break their queue's schema: the whole step is handled, as before
            return (*self.handled(snapshot, failure.cause), failure.cause)
        # some call succeeded: the step delivered what its rows gave (an empty result included)
        return staged, counts, (None if found.good else cause)

    def begin(self) -> Snapshot | None:  # pragma: no cover - every stepper defines it
        raise NotImplementedError

    def complete(self, snapshot: Snapshot,
                 prepared: tuple[dict, dict, Exception | None]) -> StepResult:  # pragma: no cover
        raise NotImplementedError

    def step(self) -> StepResult | None:
        """One whole step: :meth:`begin` (step 1), read and call (2), prepare (3),
        :meth:`complete` (the commits). ``None``: no input to step on."""
        snapshot = self.begin()
        if snapshot is None:
            return None
        return self.complete(snapshot, self.run_and_prepare(snapshot))

    def platform_error(self, snapshot: Snapshot, failure: StepFailure) -> PlatformStepError:
        cause = failure.cause
        first = (str(cause).strip().splitlines() or [""])[0][:300]
        then = ("the step's input is lost (at_most_once saved its positions first)"
                if self.processor.strategy.value == "at_most_once" else
                "the next start reads the same input again from the same positions")
        return PlatformStepError(
            f"processor {self.processor.id!r} stopped at step {snapshot.step} (delivery hash "
            f"{snapshot.delivery_hash}): {type(cause).__name__} while {failure.phase.value}, which is not "
            f"the processor function's own error ({first}); nothing was delivered and no error row was "
            f"written; fix the cause if it persists and restart: {then}",
            processor=self.processor.id, step=snapshot.step, delivery_hash=snapshot.delivery_hash,
            phase=failure.phase.name.lower(), cause_type=qualified_name(type(cause)))

    def prepare(self, snapshot: Snapshot, result: Any) -> tuple[dict, dict]:
        if self.processor.kind is Kind.SINK:
            return {}, {}
        with failing_as(Phase.MATERIALIZE):
            by_binding = split_outputs(result, self.processor.outputs, processor=self.processor.id)
            out = executor_output(self.processor, self.graph, by_binding, home=home_of(self.processor),
                                  input_rows=snapshot.rows)
            if out is not None:
                # the executors write the rows; the driver keeps only the files' footers
                written = write_by_executors(next(iter(by_binding.values())), self.queues[out.queue],
                                             partition=out.partition or "0",
                                             delivery_hash=snapshot.delivery_hash)
                if written is None:
                    return {}, {}
                if isinstance(written, WrittenPart):
                    return {out.queue: {written.partition: written}}, {out.queue: {written.partition: written.rows}}
                by_binding = {next(iter(by_binding)): written}  # the rows, back for the driver path
            arrow = {binding: without_metadata(to_arrow(value)) for binding, value in by_binding.items()}
        with failing_as(Phase.STAGE):
            return self._stage_outputs(snapshot, arrow)

    def _stage_outputs(self, snapshot: Snapshot, arrow: Mapping[str, pa.Table]) -> tuple[dict, dict]:
        return self.keep(snapshot, self._output_tables(snapshot, arrow))

    def _output_tables(self, snapshot: Snapshot, arrow: Mapping[str, pa.Table]) -> dict[str, dict]:
        """The function's rows by queue and partition, rows breaking a contract split off as
        error rows (step 3, before conforming)."""
        tables: dict[str, dict] = {}
        for binding, table in arrow.items():
            out = self.processor.outputs[binding]
            contract = self.graph.queues[out.queue].contract
            if checked_in_step(contract) and table.num_rows:  # pyspark contracts: the Dagster check
                table, bad, reasons = split_by_contract(table, contract, queue=out.queue)
                if bad.num_rows:
                    if not self.error_queue_name:
                        raise SchemaError(
                            f"processor {self.processor.id!r}: {bad.num_rows} row(s) break the contract "
                            f"of queue {out.queue!r} ({reasons[0]}) and no error queue is configured",
                            processor=self.processor.id, queue=out.queue)
                    errors = contract_error_table(snapshot, queue=out.queue, bad=bad, reasons=reasons)
                    mine = tables.setdefault(self.error_queue_name, {})
                    mine["0"] = pa.concat_tables([mine["0"], errors]) if "0" in mine else errors
            if table.num_rows:
                for part, t in partitioned(table, out, self.queues[out.queue]).items():
                    tables.setdefault(out.queue, {})[part] = t
        return tables

    def handled(self, snapshot: Snapshot, exc: Exception) -> tuple[dict, dict]:
        """A handled failure: stage one error row for the error queue, or stop the processor."""
        if not self.error_queue_name:
            raise UnhandledStepError(
                f"processor {self.processor.id!r} failed on step {snapshot.step} "
                f"({type(exc).__name__}: {exc}) and has no error queue; fix the cause and restart: "
                "the same input ranges will be retried", processor=self.processor.id,
                step=snapshot.step, delivery_hash=snapshot.delivery_hash) from exc
        return self.keep(snapshot, {self.error_queue_name: {"0": error_table(snapshot, exc)}})

    def keep(self, snapshot: Snapshot, tables: Mapping[str, Mapping[str, pa.Table]]) -> tuple[dict, dict]:
        """Step 3 keeps the conformed outputs in memory: ``({queue: {partition: table}}, counts)``."""
        return conformed(self.queues, tables)

    @staticmethod
    def _by_pair(snapshot: Snapshot, attr: str) -> dict[tuple[str, str], int]:
        return {(r.queue, r.partition): getattr(r, attr) for r in snapshot.inputs.values()}

    def starts_of(self, snapshot: Snapshot) -> dict[str, int]:
        """The positions a recorded ``snapshot`` starts at, by this processor's bindings (matched
        by queue and partition: a recorded binding name says nothing after a redeploy)."""
        starts = self._by_pair(snapshot, "start")
        return {b: starts.get((s.queue, s.partition), self.positions.get(b, 0))
                for b, s in self.processor.inputs.items()}

    def advance(self, snapshot: Snapshot) -> None:
        """Step 6: positions to the snapshot's ends, matched by queue and partition (a replay
        step's ranges are old ones: only the step number moves)."""
        self.next_step = snapshot.step + 1
        if snapshot.replay is not None:
            return
        ends = self._by_pair(snapshot, "end")
        for binding, src in self.processor.inputs.items():
            if (src.queue, src.partition) in ends:
                self.positions[binding] = ends[(src.queue, src.partition)]


class ExactlyOnceStepper(StepBase):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.backing = self.backing_of(self.processor.id)
        self.home = home_of(self.processor)
        self.epoch = -1
        self.pending: Snapshot | None = None

    def fence(self) -> int:
        """A new epoch in the backing queue, then the same one in the home queue (see above)."""
        minimum = 0
        for _ in range(FENCE_ATTEMPTS):
            epoch = self.backing.fence(minimum=minimum)
            if self.home is None:
                return epoch
            taken = fence_home(self.queues[self.home], self.processor.id, epoch)
            if taken is None:
                return epoch
            minimum = taken + 1  # another instance got there first: go above it
        raise ProcessorFencedError(f"processor {self.processor.id!r}: could not start a new epoch; "
                                   "another instance keeps starting", processor=self.processor.id)

    def recover(self) -> StepResult | None:
        """Fence older instances and resolve the home queue and the last backing record. Returns
        the rolled-forward step, if any."""
        self.epoch = self.fence()
        self.hook("recovery_fenced")
        last = self.backing.last_record()
        self.pending = None
        home = read_home(self.queues[self.home], self.processor) if self.home else None
        done = home.step if home is not None else -1
        if last is not None and last.step > done:
            if last.type is RecordType.SNAPSHOT:
                self._refuse_changed_snapshot(last.snapshot)
                self.pending = last.snapshot  # retry the same ranges (and the same alts binding)
                self.next_step = last.step
                self.positions = self.starts_of(last.snapshot)
                return None
            result = self.deliver(last, recovered=True)  # an attempt the home does not close yet
            self.advance(last.snapshot)
            if last.snapshot.replay is not None:  # its ranges say nothing of the positions
                home = read_home(self.queues[self.home], self.processor)  # type: ignore[index]
                self.positions = self._stored_positions(home, None)  # type: ignore[arg-type]
            return result
        if done < 0:
            self.positions = {b: self.first_offset(b) for b in self.processor.inputs}
            self.next_step = 0
            return None
        same = (last is not None and last.step == done and last.is_attempt
                and last.type is not RecordType.DIGEST)
        if same:
            remove_staging(self.lake, last.snapshot)  # delivered: only staged files may remain
        self.positions = self._stored_positions(home, last if same else None)  # type: ignore[arg-type]
        self.next_step = done + 1
        return None

    def _stored_positions(self, home: HomeState, last: Record | None) -> dict[str, int]:
        """The positions after the home's last step, by binding, from the (queue, partition) keys;
        a lake written before those keys is migrated once: its binding-keyed positions are copied
        to the keys of the queue partitions its last step read (from that step's recorded
        snapshot), or, where the home stored none (an older protocol), taken from that snapshot's
        ends. A binding whose queue partition this processor never read starts at its start
        offset (0 until retention removed rows; ``processing/deployments.py`` refused the
        changes where that would re-deliver)."""
        if home.keyed:
            return {b: self.first_offset(b) if v is None else v for b, v in home.positions.items()}
        snapshot = last.snapshot if last is not None else self._last_step_snapshot(home.step)
        if snapshot is None:
            raise RecoveryError(
                f"processor {self.processor.id!r}: home queue {self.home!r} has step {home.step} but "
                "neither its input positions nor a record of that step; the lake was changed "
                "outside the protocol (run `cues audit`)",
                processor=self.processor.id, step=home.step, queue=self.home)
        read = {b: (r.queue, r.partition) for b, r in snapshot.inputs.items()}
        stored = migrate_legacy_positions(self.queues[self.home], self.processor.id,  # type: ignore[index]
                                          epoch=self.epoch, read=read)
        ends = {(r.queue, r.partition): r.end for r in snapshot.inputs.values()}
        return {b: stored.get((src.queue, src.partition), ends.get((src.queue, src.partition), 0))
                for b, src in self.processor.inputs.items()}

    def _last_step_snapshot(self, step: int) -> Snapshot | None:
        """The recorded snapshot of delivered step ``step`` (O(history): only when migrating)."""
        found = [r.snapshot for r in processor_history(self.lake, self.processor.id)
                 if r.is_attempt and r.step == step]
        return found[-1] if found else None

    def _refuse_changed_snapshot(self, snapshot: Snapshot) -> None:
        recorded = {(b, r.queue, r.partition) for b, r in snapshot.inputs.items()}
        now = {(b, s.queue, s.partition) for b, s in self.processor.inputs.items()}
        if recorded != now:
            raise StepInFlightError(
                f"processor {self.processor.id!r} recorded step {snapshot.step} (delivery hash "
                f"{snapshot.delivery_hash}) before its function ran, reading "
                f"{sorted(recorded)}; it now reads {sorted(now)}: the step must be finished with "
                "the bindings it began with. Ways out: run the previous graph until idle, then "
                "deploy this one", processor=self.processor.id, change="step_in_flight",
                step=snapshot.step, delivery_hash=snapshot.delivery_hash)

    def deliver(self, attempt: Record, *, recovered: bool = False) -> StepResult:
        """Step 5 for every output queue of the attempt, the home last (idempotent: the
        roll-forward)."""
        snapshot = attempt.snapshot
        files: dict[str, dict[str, str]] = attempt.outputs.get("files", {})
        counts: dict[str, dict[str, int]] = attempt.outputs.get("rows", {})
        message_type = "error" if attempt.type is RecordType.ATTEMPT_ERROR else "message"
        for qname, parts in sorted(files.items()):
            if qname == self.home:
                continue
            queue = self.queues.get(qname) or self.lake.queue(qname)
            if not delivered_to(queue, self.processor.id, snapshot.step):
                with self._staged(snapshot, qname):
                    commit_staged(self.lake, queue, snapshot, parts, message_type=message_type)
            if self.home is not None:
                self.hook("between_commits")
        home = self.queues[self.home] if self.home is not None else None
        if home is not None and home_guard(home, self.processor.id, epoch=self.epoch,
                                           step=snapshot.step)(home.refresh()) is None:
            # (checked first: a fenced instance, or a step already closed, reads no staged file)
            with self._staged(snapshot, home.name):
                tables = (read_staged(files[home.name], self.lake.options, lake=self.lake,
                                      snapshot=snapshot, queue=home.name)
                          if home.name in files else {})
            commit_step(self.queues[self.home], snapshot, tables, epoch=self.epoch,
                        outcome=attempt.type, rows=counts, is_record=False, message_type=message_type)
        remove_staging(self.lake, snapshot)
        rows = {q: sum(p.values()) for q, p in counts.items()}
        return StepResult(snapshot.step, snapshot.delivery_hash, _OUTCOMES.get(attempt.type, "nil"),
                          snapshot.inputs, snapshot.rows, rows, attempt.error, recovered)

    @contextmanager
    def _staged(self, snapshot: Snapshot, qname: str) -> Iterator[None]:
        try:
            yield
        except (FileNotFoundError, OSError) as exc:
            raise RecoveryError(
                f"processor {self.processor.id!r}: staged output of step {snapshot.step} for "
                f"queue {qname!r} is gone ({exc}); it cannot be rolled forward",
                processor=self.processor.id, step=snapshot.step, queue=qname) from exc

    def begin(self) -> Snapshot | None:
        self.hook("before_snapshot")
        # Step 1
        self._planned = None  # only this begin's plans are read by step 2
        snapshot = self.pending
        if snapshot is None:
            snapshot = self.plan_snapshot()
            if snapshot is None:
                return None
            if self.home is None or self.processor.options.snapshot_at is SnapshotAt.READ:
                # a sink (or a function with effects keyed by the hash) records its snapshot
                # before the function: a retry must see the same ranges and hash
                self.backing.append(Record(RecordType.SNAPSHOT, snapshot, self.epoch))
            self.pending = snapshot
        self.hook("after_snapshot")
        return snapshot

    def complete(self, snapshot: Snapshot, prepared: tuple[dict, dict, Exception | None]) -> StepResult:
        tables, counts, exc = prepared
        error = None if exc is None else f"{type(exc).__name__}: {exc}"
        kind = (RecordType.ATTEMPT_ERROR if exc is not None else
                RecordType.ATTEMPT_OUTPUT if tables else RecordType.ATTEMPT_NIL)
        message_type = "error" if exc is not None else "message"
        self.hook("after_prepare")
        if self.home is not None and set(tables) <= {self.home} and snapshot.replay is None:
            # Step 4 (one commit: the step's rows, positions and snapshot, atomically; a replay
            # step takes the attempt path: its attempt record is the replay log's entry)
            commit_step(self.queues[self.home], snapshot, tables.get(self.home, {}), epoch=self.epoch,
                        outcome=kind, rows=counts, is_record=True, message_type=message_type)
            self.hook("after_commit")
            result_ = StepResult(snapshot.step, snapshot.delivery_hash, _OUTCOMES.get(kind, "nil"),
                                 snapshot.inputs, snapshot.rows,
                                 {q: sum(p.values()) for q, p in counts.items()}, error)
        else:
            # Step 4 (an attempt over several queues)
            staged = stage(self.lake, snapshot, tables) if tables else {}
            attempt = self.backing.append(Record(kind, snapshot, self.epoch,
                                                 {"files": staged, "rows": counts} if staged else {}, error))
            self.hook("after_attempt")
            # Step 5
            result_ = self.deliver(attempt)
            self.hook("after_commit")
        # Step 6
        self.pending = None
        self.advance(snapshot)
        every = self.processor.options.backing_maintenance_every
        if every and self.next_step % max(1, every // self.sharing_home()) == 0:
            self.digest_steps()
        if every and self.next_step % every == 0 and self.backing.queue.next_offset("0"):
            self.backing.maintain()
        return result_

    def sharing_home(self) -> int:
        """How many exactly_once processors of the graph (lanes count one each) step into this
        one's home queue. Each digests every ``backing_maintenance_every / n`` of its steps, so a
        home shared by n lanes is digested and trimmed as often as one processor's home (a digest
        holds every processor's steps), not n times less often."""
        return max(1, sum(1 for p in self.graph.processors.values()
                          if p.strategy is self.processor.strategy and home_of(p) == self.home))

    def digest_steps(self) -> None:
        """Digest the home queue's step commits (every processor's homed there: lanes share
        homes, and a quiet lane's steps must be held before anyone trims them) into the home's
        digest queue, then trim the home's log below what the digests hold (the auditor reads
        both; recovery needs neither). No expired-entry cleanup by age: what may go is decided by
        what is digested, never by the local clock."""
        if self.home is None:
            return
        home = self.queues[self.home]
        upto = HomeDigests(self.lake, self.home).digest(home)
        # Only now may the home's old log entries go: every step they hold is digested (commits
        # skip delta-rs' per-commit cleanup: queues/maintenance.py, COMMIT_HOOKS).
        trim_home_log(home, digested=upto)


_OUTCOMES = {RecordType.ATTEMPT_OUTPUT: "output", RecordType.ATTEMPT_ERROR: "error"}
