"""The step IO manager of ``@processor_asset``: inputs are a step's queue ranges, the output is
delivered with the step's delivery hash.

One materialization of a function asset is one step of ``processing/phased.py``, cut along
Dagster's own phases:

1. ``load_input`` (first input of the op): recovery through the ``backing`` resource (fence,
   roll a prepared attempt forward), then step 1 (the snapshot: ranges and delivery hash) and the
   read; every input gets its binding's lazy Spark frame of that snapshot. No new input: the
   frames are None and the body does not call the function. An exactly-once lane with no unread
   row and nothing to recover (``processing/idle.py``; no fault injection configured) is not even
   started: no recovery, so no fencing commit: a materialization with nothing to do commits
   nothing (as the runner face's ``assets.idle_lane``).
2. The asset body (``function_assets.py``): the user's function on the frames; its own
   exception is a handled error (the error queue), anything else fails the op.
3. ``handle_output`` (first output): step 3 (the Spark plan runs, rows are conformed to the
   queue) and the commit(s): for a map/join/alts, ONE Delta commit to the output queue carrying
   the rows with their delivery hash, the input positions and the step; a fork or a sink goes
   through its attempt record in the backing queue. Later outputs of a fork report metadata only:
   every output queue of the step is committed in the FIRST ``handle_output`` (never one commit
   per output handed over).

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
from dataclasses import dataclass, field
from typing import Any

from dagster import InputContext, OutputContext, ResourceDependency
from pydantic import PrivateAttr

from cues_platform.dagster.error_queues import observe_error_queue
from cues_platform.dagster.io_manager import QUEUE_METADATA, CuesIOManager
from cues_platform.dagster.keys import queue_key
from cues_platform.dagster.materialize import (
    FaultConfig,
    failure_headline,
    fault_hook,
    pending_delivery,
    queue_metadata,
    step_metadata,
)
from cues_platform.dagster.resources import BackingQueueResource, describe_record, spark_session_of
from cues_platform.errors import ConfigurationError
from cues_platform.processing.graph import Graph, Processor
from cues_platform.processing.home import home_of
from cues_platform.processing.idle import lane_work
from cues_platform.processing.model import Kind, Strategy
from cues_platform.processing.phased import PhasedStep
from cues_platform.processing.step import StepResult

STEP_IO_KEY = "cues_step_io"
STEP_BINDING = "cues/binding"  # input metadata: the processor's input binding the input is


@dataclass(frozen=True)
class FunctionTarget:
    """What a function asset's op steps: attached to its compute function (``cues_target``)."""

    graph: Graph
    processor: Processor
    prefix: tuple[str, ...] = ()


@dataclass(frozen=True)
class IdleLane:
    """What the metadata reads of a stepper (``positions``, ``pending``), for a lane not started."""

    positions: dict[str, int]
    pending: None = None


def idle_positions(lake: Any, proc: Processor) -> IdleLane | None:
    """The positions of an exactly-once processor with inputs that has no unread row and nothing
    to recover, else None (it is started: recovery, then a step if its input allows one)."""
    if proc.strategy is not Strategy.EXACTLY_ONCE or not proc.inputs or proc.kind is Kind.SOURCE:
        return None
    work = lane_work(lake, proc)
    return None if work.has_work else IdleLane(dict(work.positions))


@dataclass
class StepRun:
    """One materialization's step, from ``load_input`` to ``handle_output``."""

    target: FunctionTarget
    phased: PhasedStep
    before: dict[str, dict[str, int]]  # output queue -> end offsets before recovery
    found: dict[str, Any]  # the last backing record recovery found, in words
    rolled: bool  # recovery had an undelivered attempt to roll forward
    idle: IdleLane | None = None  # not started: nothing to read, nothing to recover
    started: float = field(default_factory=time.monotonic)
    results: list[StepResult] | None = None

    def delivered(self) -> list[StepResult]:
        if self.results is None:
            result = self.phased.deliver()
            recovered = self.phased.recovered
            self.results = [r for r in (recovered if self.rolled else None, result) if r is not None]
        return self.results


@dataclass(frozen=True)
class StepInput:
    """What ``load_input`` gives the body: the step, and this binding's frame (None: no input)."""

    run: StepRun
    frame: Any


@dataclass(frozen=True)
class StepOutcome:
    """What the body returns for every output: the step, its function called."""

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
        if run is None:  # the op's first input opens the step; a join's second input reuses it
            target = target_of(context.op_def)
            config = FaultConfig(**(context.step_context.op_config or {}))
            with failure_headline(target.processor.id):
                run = self._open[key] = self.open_run(target, config)
        return StepInput(run, run.phased.frames.get(binding))

    def open_run(self, target: FunctionTarget, config: FaultConfig) -> StepRun:
        """Open (recover, plan, read) the step of one materialization of ``target``: from the
        first ``load_input``, or from the asset body of a source (which has no input to load)."""
        graph, proc = target.graph, target.processor
        lake = self.backing.lake.lake()  # the lake of the backing queues: the step's whole lake
        holder: dict[str, Any] = {}
        phased = self.backing.open_step(graph=graph, processor=proc, spark=spark_session_of(self.spark),
                                        hook=fault_hook(config, proc.id, lambda: holder.get("stepper")))
        holder["stepper"] = phased.stepper
        backing = getattr(phased.stepper, "backing", None)
        last = backing.last_record() if backing is not None else None
        outputs = sorted({o.queue for o in proc.outputs.values()})
        # with a fault injected the step starts anyway: its recovery points are the test's target
        idle = idle_positions(lake, proc) if not config.inject_failure_at else None
        run = StepRun(target, phased, before={q: lake.queue(q).end_offsets() for q in outputs},
                      found=describe_record(last),
                      rolled=pending_delivery(lake, proc.id, last, home=home_of(proc)), idle=idle)
        if idle is None:
            phased.start()
        return run

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        if not isinstance(obj, StepOutcome):
            super().handle_output(context, obj)
            return
        run = obj.run
        first = run.results is None
        with failure_headline(run.target.processor.id):
            results = run.delivered()
        self._open.pop((context.run_id, context.step_key, _attempt(context)), None)
        graph, proc = run.target.graph, run.target.processor
        lake = run.phased.stepper.lake
        meta = step_metadata(graph, proc, lake=lake, stepper=run.idle or run.phased.stepper, results=results,
                             stopped="one step" if results else "no new input", found=run.found,
                             elapsed=time.monotonic() - run.started)
        queue = (context.definition_metadata or {}).get(QUEUE_METADATA)
        if queue is not None:
            meta.update(queue_metadata(context.step_context.instance, context.asset_key, lake.queue(queue),
                                       before=run.before.get(queue, {}), results=results))
        context.add_output_metadata(meta)
        if not first:
            return
        context.log.info(
            f"processor {proc.id}: {meta['cues/steps']} step(s), {meta['cues/rows_in']} row(s) in, "
            f"{meta['cues/rows_out']} out, {meta['cues/rows_to_errors']} to errors, "
            f"{meta['cues/recovered_attempts']} rolled forward; lag {meta['cues/lag_total']}")
        err = graph.error_queue_of(proc)
        if err and err not in {o.queue for o in proc.outputs.values()}:
            context.log_event(observe_error_queue(lake, err, key=queue_key(err, run.target.prefix),
                                                  processor=proc.id,
                                                  rows_from_run=meta["cues/rows_to_errors"]))


def _attempt(context: OutputContext) -> int:
    return context.step_context.previous_attempt_count


__all__ = ["STEP_BINDING", "STEP_IO_KEY", "CuesStepIOManager", "FunctionTarget", "IdleLane", "StepInput",
           "StepOutcome", "StepRun", "idle_positions", "target_of"]
