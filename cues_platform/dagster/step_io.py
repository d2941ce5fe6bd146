"""The step IO manager of ``@processor_asset``: inputs are a step's queue ranges, the output is
delivered with the step's delivery hash.

One materialization of a function asset is one step of each of the processor's lanes
(``processing/phased.py``; a processor without an every-partition binding is one lane of itself),
cut along Dagster's own phases:

1. ``load_input`` (first input of the op): for each lane in partition order, recovery through the
   ``backing`` resource (fence, roll a prepared attempt forward), then step 1 (the snapshot:
   ranges and delivery hash) and the read; every input gets its binding's lazy Spark frame of each
   lane's snapshot. No new input: the frames are None and the body does not call the function.
   An exactly-once lane with no unread row and nothing to recover (``processing/idle.py``; no
   fault injection configured) is not even started: no stepper, no recovery, so no fencing commit
   and no backing queue created: a lane with nothing to do commits nothing (as the runner face's
   ``assets.idle_lane``).
2. The asset body (``function_assets.py``): the user's function on each started lane's frames,
   once per lane; its own exception is a handled error (the error queue), anything else fails the
   op before any lane delivered.
3. ``handle_output`` (first output): for each started lane in turn, step 3 (the Spark plan runs,
   rows are conformed to the queue) and the commit(s) through the lane's own protocol: for a
   map/join/alts, ONE Delta commit to the output queue carrying the rows with their delivery hash,
   the lane's input positions and its step; a fork or a sink goes through its attempt record in
   the lane's backing queue. Later outputs of a fork report metadata only: every output queue of
   every lane is committed in the FIRST ``handle_output`` (never one commit per output handed
   over).

Lanes are independent (each its own backing queue, positions ``pos:{lane}:...`` and app
transaction ``proc:{lane}``): a lane whose delivery fails does not undo or stop the others. Every
lane has its turn, then the op fails with the first lane's failure (the others are logged): the
lanes already delivered stay delivered, and the retry or re-execution recovers the failed lane
only (the delivered ones are idle, or step on newer rows).

A source has no input to load: its asset body opens the step (:meth:`CuesStepIOManager.open_run`:
the saved step counter is the step), calls ``fn(ctx)``, and ``handle_output`` delivers each
non-empty output in one commit per queue guarded by the step, then saves the counter
(``processing/phased.py``).

Abort between the phases (the op fails, the run process is killed, Dagster retries): nothing was
committed that recovery does not resolve, exactly as a crash at the same hook point of
``cues run`` (the crash tests run both faces). A plain downstream asset that reads a function
asset's queue gets the whole queue (read_committed), as from :class:`CuesIOManager`.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dagster import InputContext, OutputContext, ResourceDependency
from deltalake import DeltaTable
from pydantic import PrivateAttr

from cues_platform.dagster.error_queues import observe_error_queue
from cues_platform.dagster.io_manager import QUEUE_METADATA, CuesIOManager
from cues_platform.dagster.keys import queue_key
from cues_platform.dagster.materialize import (
    FaultConfig,
    failure_headline,
    fault_hook,
    headline,
    merge_lane_metadata,
    pending_delivery,
    queue_metadata,
    step_metadata,
)
from cues_platform.dagster.resources import BackingQueueResource, describe_record, spark_session_of
from cues_platform.errors import ConfigurationError
from cues_platform.processing.backing import BackingQueue
from cues_platform.processing.deployments import check_and_record
from cues_platform.processing.graph import Graph, Processor
from cues_platform.processing.home import home_of
from cues_platform.processing.idle import lane_work
from cues_platform.processing.lanes import ALL_PARTITIONS
from cues_platform.processing.model import Kind, Strategy
from cues_platform.processing.phased import PhasedStep
from cues_platform.processing.runner import create_queues, needs_spark
from cues_platform.processing.step import StepResult
from cues_platform.queues import Lake

STEP_IO_KEY = "cues_step_io"
STEP_BINDING = "cues/binding"  # input metadata: the processor's input binding the input is


@dataclass(frozen=True)
class FunctionTarget:
    """What a function asset's op steps: attached to its compute function (``cues_target``).
    ``processor`` is the processor as declared (``Graph.as_declared``)."""

    graph: Graph
    processor: Processor
    prefix: tuple[str, ...] = ()

    def lanes(self, lake: Lake) -> tuple[Graph, list[Processor]]:
        """The graph over the lake's partitions and the processor's lanes in it, in partition
        order: one per partition of an every-partition binding (those of partitions added since
        the graph was built included, as the runner face's ``refresh_lanes``), else itself."""
        graph = self.graph
        declared = next((p for p in graph.declared if p.id == self.processor.id), self.processor)
        every = {i.queue for i in declared.inputs.values() if i.partition == ALL_PARTITIONS}
        if every:
            graph = graph.with_lake_partitions({q: lake.queue(q).partitions for q in sorted(every)
                                                if lake.has_queue(q)})
        return graph, graph.lanes_of(self.processor.id)


@dataclass(frozen=True)
class IdleLane:
    """What the metadata reads of a stepper (``positions``, ``pending``), for a lane not started."""

    positions: dict[str, int]
    pending: None = None


def idle_positions(lake: Any, proc: Processor) -> IdleLane | None:
    """The positions of an exactly-once processor lane with inputs that has no unread row and
    nothing to recover, else None (it is started: recovery, then a step if its input allows one)."""
    if proc.strategy is not Strategy.EXACTLY_ONCE or not proc.inputs or proc.kind is Kind.SOURCE:
        return None
    work = lane_work(lake, proc)
    return None if work.has_work else IdleLane(dict(work.positions))


def _last_record(lake: Lake, lane_id: str) -> Any:
    """The last record of the lane's backing queue, read only when that queue exists (an idle
    lane never creates it: creating it is a commit)."""
    if not DeltaTable.is_deltatable(lake.system_uri("backing", lane_id), storage_options=lake.options):
        return None
    return BackingQueue(lake, lane_id).last_record()


@dataclass
class LaneStep:
    """One lane's step of a materialization: ``phased`` None when the lane was not started (idle:
    nothing to read, nothing to recover)."""

    processor: Processor  # the lane
    phased: PhasedStep | None
    found: dict[str, Any]  # the last backing record recovery found, in words
    rolled: bool  # recovery had an undelivered attempt to roll forward
    idle: IdleLane | None = None
    results: list[StepResult] | None = None
    failure: Exception | None = None  # its delivery failed (the op fails once every lane had its turn)

    def deliver(self) -> list[StepResult]:
        """Steps 3-6 of this lane, once: what it delivered (a rolled-forward attempt included)."""
        if self.results is None:
            if self.phased is None:
                self.results = []
            else:
                result = self.phased.deliver()
                recovered = self.phased.recovered
                self.results = [r for r in (recovered if self.rolled else None, result) if r is not None]
        return self.results


@dataclass
class StepRun:
    """One materialization: a step of each lane, from ``load_input`` to ``handle_output``."""

    target: FunctionTarget
    graph: Graph  # the target's graph over the lake's partitions (its lanes are in it)
    lake: Lake
    before: dict[str, dict[str, int]]  # output queue -> end offsets before any recovery
    lanes: dict[str, LaneStep] = field(default_factory=dict)  # lane id -> its step, partition order
    started: float = field(default_factory=time.monotonic)
    failures: dict[str, Exception] | None = None  # None: not delivered yet

    @property
    def started_lanes(self) -> list[LaneStep]:
        return [lane for lane in self.lanes.values() if lane.phased is not None]

    def delivered(self, log: Callable[[str], None] | None = None) -> list[StepResult]:
        """Every lane's delivery through its own protocol, once, in lane order. A lane's failure
        does not stop the next lanes (their commits are their own); once every lane had its
        turn, the first failure is raised (its type and cause kept; a note names the lanes that
        delivered and the other failures). What every lane delivered, else."""
        if self.failures is None:
            failures: dict[str, Exception] = {}
            for lane_id, lane in self.lanes.items():
                try:
                    lane.deliver()
                except Exception as exc:  # noqa: BLE001 -- raised below, once every lane had its turn
                    lane.failure = failures[lane_id] = exc
            self.failures = failures
        if self.failures and len(self.lanes) == 1:
            raise next(iter(self.failures.values()))
        if self.failures:
            first_id, first = next(iter(self.failures.items()))
            done = [i for i, lane in self.lanes.items() if lane.results]
            note = (f"processor {self.target.processor.id!r}: lane {first_id!r} failed; lanes "
                    f"delivered in this materialization: {done or 'none'} (they stay delivered); "
                    f"lanes failed: {sorted(self.failures)}; the next materialization recovers "
                    "the failed lanes")
            if log is not None:
                log(note + "".join(f"\n  {i}: {headline(e)}" for i, e in self.failures.items()))
            if note not in getattr(first, "__notes__", ()):
                first.add_note(note)
            raise first
        return [r for lane in self.lanes.values() for r in (lane.results or [])]


@dataclass(frozen=True)
class StepInput:
    """What ``load_input`` gives the body: the materialization's steps, and this binding's frame
    of each lane (lane id -> frame; None: no input)."""

    run: StepRun
    frames: dict[str, Any]


@dataclass(frozen=True)
class StepOutcome:
    """What the body returns for every output: the steps, their function called."""

    run: StepRun


def target_of(op_def: Any) -> FunctionTarget:
    fn = getattr(getattr(op_def, "compute_fn", None), "decorated_fn", None)
    target = getattr(fn, "cues_target", None)
    if not isinstance(target, FunctionTarget):
        raise ConfigurationError(
            f"op {getattr(op_def, 'name', op_def)!r} loads an input through {STEP_IO_KEY!r}, which "
            "serves only the inputs of @processor_asset assets; give the input another IO manager")
    return target


class CuesStepIOManager(CuesIOManager):
    """:class:`CuesIOManager` plus the step inputs and outputs of function assets."""

    backing: ResourceDependency[BackingQueueResource]
    _open: dict = PrivateAttr(default_factory=dict)

    def load_input(self, context: InputContext) -> Any:
        binding = (context.definition_metadata or {}).get(STEP_BINDING)
        if binding is None:
            return super().load_input(context)
        step_ctx = context.step_context
        key = (step_ctx.run_id, step_ctx.step.key, step_ctx.previous_attempt_count)
        run = self._open.get(key)
        if run is None:  # the op's first input opens the steps; a join's second input reuses them
            target = target_of(context.op_def)
            config = FaultConfig(**(context.step_context.op_config or {}))
            with failure_headline(target.processor.id):
                run = self._open[key] = self.open_run(target, config)
        return StepInput(run, {i: lane.phased.frames.get(binding) if lane.phased is not None else None
                               for i, lane in run.lanes.items()})

    def open_run(self, target: FunctionTarget, config: FaultConfig) -> StepRun:
        """Open (recover, plan, read) the step of each lane of one materialization of ``target``:
        from the first ``load_input``, or from the asset body of a source (which has no input to
        load). A lane with nothing to do is not started (see the module docstring); with a fault
        injected every lane starts (its recovery points are the test's target)."""
        lake = self.backing.lake.lake()  # the lake of the backing queues: the step's whole lake
        graph, lanes = target.lanes(lake)
        outputs = sorted({o.queue for lane in lanes for o in lane.outputs.values()})
        if not all(lake.has_queue(q) for q in outputs):  # a new lake: as PhasedStep.create does
            check_and_record(graph, lake, only=[lane.id for lane in lanes])
            create_queues(graph, lake)
        run = StepRun(target, graph, lake, before={q: lake.queue(q).end_offsets() for q in outputs})
        spark = None
        for lane in lanes:
            idle = idle_positions(lake, lane) if not config.inject_failure_at else None
            if idle is not None:
                run.lanes[lane.id] = LaneStep(lane, None, found=describe_record(_last_record(lake, lane.id)),
                                              rolled=False, idle=idle)
                continue
            if spark is None and needs_spark(graph, [lane.id]):  # an Arrow lane starts no JVM
                spark = spark_session_of(self.spark)
            run.lanes[lane.id] = self._open_lane(graph, lane, lake, spark, config)
        return run

    def _open_lane(self, graph: Graph, lane: Processor, lake: Lake, spark: Any,
                   config: FaultConfig) -> LaneStep:
        """Start one lane's step: its stepper through the ``backing`` resource, recovery, step 1
        and the read. Fault injection fires in this lane at its points (``processor`` in the
        injected failure is the lane's id; ``inject_failure_step`` is the lane's step number)."""
        holder: dict[str, Any] = {}
        phased = self.backing.open_step(graph=graph, processor=lane, spark=spark,
                                        hook=fault_hook(config, lane.id, lambda: holder.get("stepper")))
        holder["stepper"] = phased.stepper
        backing = getattr(phased.stepper, "backing", None)
        last = backing.last_record() if backing is not None else None
        step = LaneStep(lane, phased, found=describe_record(last),
                        rolled=pending_delivery(lake, lane.id, last, home=home_of(lane)))
        phased.start()
        return step

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        if not isinstance(obj, StepOutcome):
            super().handle_output(context, obj)
            return
        run = obj.run
        first = run.failures is None
        proc = run.target.processor
        with failure_headline(proc.id):
            results = run.delivered(context.log.error)
        self._open.pop((context.run_id, context.step_key, _attempt(context)), None)
        graph, lake = run.graph, run.lake
        elapsed = time.monotonic() - run.started
        lanes = {i: step_metadata(graph, lane.processor, lake=lake,
                                  stepper=lane.idle or lane.phased.stepper,  # type: ignore[union-attr]
                                  results=lane.results or [],
                                  stopped="one step" if lane.results else "no new input",
                                  found=lane.found, elapsed=elapsed)
                 for i, lane in run.lanes.items()}
        meta = merge_lane_metadata(graph, lanes)
        queue = (context.definition_metadata or {}).get(QUEUE_METADATA)
        if queue is not None:
            meta.update(queue_metadata(context.step_context.instance, context.asset_key, lake.queue(queue),
                                       before=run.before.get(queue, {}), results=results))
        context.add_output_metadata(meta)
        if not first:
            return
        stepped = [i for i, lane in run.lanes.items() if lane.results]
        lanes_said = (f"; lanes with a step: {', '.join(stepped) or 'none'} of {len(run.lanes)}"
                      if len(run.lanes) > 1 else "")
        context.log.info(
            f"processor {proc.id}: {meta['cues/steps']} step(s), {meta['cues/rows_in']} row(s) in, "
            f"{meta['cues/rows_out']} out, {meta['cues/rows_to_errors']} to errors, "
            f"{meta['cues/recovered_attempts']} rolled forward; lag {meta['cues/lag_total']}{lanes_said}")
        err = graph.error_queue_of(proc)
        if err and err not in {o.queue for o in proc.outputs.values()}:
            context.log_event(observe_error_queue(lake, err, key=queue_key(err, run.target.prefix),
                                                  processor=proc.id,
                                                  rows_from_run=meta["cues/rows_to_errors"], graph=graph,
                                                  backing_of=self.backing.backing))


def _attempt(context: OutputContext) -> int:
    return context.step_context.previous_attempt_count


__all__ = ["STEP_BINDING", "STEP_IO_KEY", "CuesStepIOManager", "FunctionTarget", "IdleLane", "LaneStep",
           "StepInput", "StepOutcome", "StepRun", "idle_positions", "target_of"]
