"""One step in three calls, for a host that calls the processor function itself.

The Dagster face of ``@processor_asset`` (``cues_platform/dagster/step_io.py``) splits a step
across Dagster's own phases: the IO manager's ``load_input`` starts it, the asset body calls the
user's function, the IO manager's ``handle_output`` delivers it. :class:`PhasedStep` is that split
over the very steppers ``cues run`` uses (``ExactlyOnceStepper``, ``PositionStepper``), so the
protocol, its hook points and its crash safety are the ones of ``processing/step.py``:

1. ``start``: recovery (fence older instances, roll a prepared attempt forward), then step 1
   (plan the ranges; a sink or ``snapshot_at=read`` records its snapshot here) and the read of
   step 2 (lazy Spark frames). No input: ``snapshot`` is None and nothing is recorded.
2. ``call``: the function on the frames, its exception classified where it escapes (only the
   function's own errors are handled).
3. ``deliver``: step 3 (materialize and conform: the user's Spark plan runs here) and the
   commits of steps 4-6 (one home commit, or an attempt and its commits). Returns the result.

On abort between the calls (the host process dies, Dagster fails the step, ``deliver`` is never
called) the lake is exactly as after a crash at the same hook point of ``cues run``: nothing
recorded before the commit (``snapshot_at=commit``) or a snapshot record a retry re-uses (a sink),
so the next ``start`` re-plans or retries. Off by one: one ``PhasedStep`` is at most one step.

A processor over every partition of a queue is several lanes (``processing/lanes.py``), each a
processor of its own: the host opens one ``PhasedStep`` per lane with work (the step IO manager
does, in lane order), and each lane's step is delivered by its own stepper, so the lanes' commits
and their recovery are independent.

A source (``processing/sources.py``) has no input ranges: ``start`` takes its saved step counter
as the step (the snapshot has no inputs), ``call`` calls ``fn(ctx)`` (its exception is not handled:
a source has no error queue, as under ``cues run``) and ``deliver`` appends each non-empty output
in one commit per queue guarded by ``proc:{processor} = step``, then saves the next step number.
``None`` (or only empty tables) is "nothing to produce now": nothing is written, not a step. A
crash before the counter is saved calls the function again with the same ``ctx.step``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cues_platform.processing.backing import BackingOf, Snapshot
from cues_platform.processing.deployments import check_and_record
from cues_platform.processing.errors import GraphError
from cues_platform.processing.graph import Graph
from cues_platform.processing.model import Kind, Processor
from cues_platform.processing.runner import create_queues
from cues_platform.processing.sources import SourceStepper
from cues_platform.processing.step import Hook, StepBase, StepFailure, StepResult
from cues_platform.processing.strategies import make_stepper
from cues_platform.queues import Lake


@dataclass
class PhasedStep:
    """An open step of one processor: ``snapshot`` None means no input to step on."""

    stepper: StepBase
    snapshot: Snapshot | None
    frames: dict[str, Any] = field(default_factory=dict)
    recovered: StepResult | None = None  # an attempt recovery rolled forward while opening
    failure: StepFailure | None = None
    result: Any = None
    called: bool = False
    delivered: StepResult | None = None

    @classmethod
    def create(cls, *, graph: Graph, processor: Processor, lake: Lake, spark: Any,
               resources: Mapping[str, Any] | None = None, hook: Hook | None = None,
               backing_of: BackingOf | None = None) -> PhasedStep:
        """The step's stepper, nothing read or recorded yet: :meth:`start` opens it
        (``backing_of``: where its backing queue is reached; default the lake's)."""
        if graph.processors.get(processor.id) is not processor:
            raise GraphError(f"processor {processor.id!r} is not in graph {graph.name!r}",
                             processor=processor.id)
        check_and_record(graph, lake, only=[processor.id])  # a changed graph: continued or refused
        create_queues(graph, lake)  # as GraphRunner does: a new lake needs no set-up
        if processor.kind is Kind.IMPERATIVE:
            raise GraphError(f"processor {processor.id!r}: an imperative processor has no step to "
                             "split in phases (it reads and appends itself); run it with its "
                             "runner-face asset", processor=processor.id)
        make = SourceStepper if processor.kind is Kind.SOURCE else make_stepper
        stepper = make(graph=graph, processor=processor, lake=lake, spark=spark,
                       resources=resources, hook=hook, backing_of=backing_of)
        return cls(stepper, None)

    def start(self) -> PhasedStep:
        """Recovery, step 1 and the read of step 2 (see the module docstring)."""
        # Step 0 (recovery)
        self.recovered = self.stepper.recover()
        if self.is_source:  # its step: the saved step counter (recover read it)
            self.snapshot = Snapshot(self.processor.id, self.stepper.next_step, {})
            return self
        # an alts rotates its first choice by step number: each materialization is a new stepper,
        # so an in-memory cursor would always start at the first binding and could starve the rest
        self.stepper._alts_cursor = self.stepper.next_step % max(1, len(self.processor.inputs))
        # Step 1
        self.snapshot = self.stepper.begin()
        if self.snapshot is not None:
            # Step 2, the read
            try:
                self.frames = self.stepper.read_frames(self.snapshot)
            except StepFailure as failure:
                self.failure = failure  # classified in deliver (a platform failure raises there)
        return self

    @property
    def processor(self) -> Processor:
        return self.stepper.processor

    @property
    def is_source(self) -> bool:
        return self.processor.kind is Kind.SOURCE

    def context(self) -> Any:
        if self.snapshot is None:
            raise GraphError(f"processor {self.processor.id!r}: no open step (no input)",
                             processor=self.processor.id)
        return self.stepper.context(self.snapshot)

    def call(self, context: Any = None) -> None:
        """Step 2: the processor function (once; the read's failure, if any, stands instead)."""
        if self.snapshot is None or self.called:
            return
        self.called = True
        if self.failure is not None:
            return
        if self.is_source:  # not classified: a source's exception fails the step, as in cues run
            self.result = self.processor.fn(self.context() if context is None else context)
            self.stepper.hook("after_function")
            return
        try:
            self.result = self.stepper.call(self.snapshot, self.frames, context)
        except StepFailure as failure:
            self.failure = failure
            return
        self.stepper.hook("after_function")

    def deliver(self) -> StepResult | None:
        """Steps 3-6, once; a platform failure raises :class:`PlatformStepError` (nothing is
        delivered). None: there was no input."""
        if self.snapshot is None:
            return None
        if self.delivered is not None:
            return self.delivered
        if not self.called:
            raise GraphError(f"processor {self.processor.id!r}: step {self.snapshot.step} is "
                             "delivered before its function was called", processor=self.processor.id)
        if self.is_source:
            self.delivered = self.stepper.deliver(self.snapshot, self.result)  # SourceStepper
            return self.delivered
        # Step 3
        prepared = self.stepper.prepared(self.snapshot, result=self.result, failure=self.failure)
        # Steps 4-6
        self.delivered = self.stepper.complete(self.snapshot, prepared)
        return self.delivered


__all__ = ["PhasedStep"]
