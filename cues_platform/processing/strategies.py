"""The faster strategies, and picking a stepper by strategy.

at_least_once (Kafka's "process, then save the position"):

1. Plan ranges from the tailer positions (one durable tailer per input, named after the processor).
2. Read, run the function, and append the outputs (with the delivery hash, no backing records).
3. Commit the tailer positions.

A crash between 2 and 3 re-runs the step on restart: its outputs appear twice, nothing is lost.

at_most_once ("save the position, then process"):

1. Plan ranges; 2. commit the tailer positions; 3. read, run, append.

A crash between 2 and the end of 3 loses the step's inputs; nothing is ever duplicated.
Errors with an error queue go there (once per attempt); without one the processor stops.
"""

from __future__ import annotations

from typing import Any

from cues_platform.processing.backing import Snapshot
from cues_platform.processing.graph import Strategy
from cues_platform.processing.outputs import remove_staging
from cues_platform.processing.step import (
    ExactlyOnceStepper,
    StepBase,
    StepResult,
    _is_contract_error,
)
from cues_platform.queues.errors import QueueError
from cues_platform.queues.positions import PositionStore

STEPS_KEY = "_steps"  # position-store key of a processor's next step number (not a queue name)


class PositionStepper(StepBase):
    """at_least_once and at_most_once: tailer positions instead of a backing queue."""

    def __init__(self, *, strategy: Strategy, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.strategy = strategy
        self.store = PositionStore(self.lake)

    def recover(self) -> StepResult | None:
        for binding, src in self.processor.inputs.items():
            got = self.store.get(queue=src.queue, tailer=self.processor.id, partition=src.partition)
            self.positions[binding] = got or 0
        # Step numbers go on across restarts (sinks key their effects by step and delivery hash).
        self.next_step = self.store.get(queue=STEPS_KEY, tailer=self.processor.id, partition="0") or 0
        return None

    def _commit_positions(self, snapshot: Snapshot) -> None:
        # One atomic commit: the step counter and every input position (the step counter never
        # lags the positions, so a delivered step's number is never reused).
        self.store.commit_many(
            [(STEPS_KEY, self.processor.id, "0", snapshot.step + 1)]
            + [(r.queue, self.processor.id, r.partition, r.end) for r in snapshot.inputs.values() if r.size]
        )

    def step(self) -> StepResult | None:
        self.hook("before_snapshot")
        # Step 1
        snapshot = self.plan_snapshot()
        if snapshot is None:
            return None
        if self.strategy is Strategy.AT_MOST_ONCE:
            # Step 2 (at_most_once)
            self._commit_positions(snapshot)
        self.hook("after_snapshot")
        outcome, error = "output", None
        try:
            result = self.run_function(snapshot)
            self.hook("after_function")
            staged, counts = self.prepare(snapshot, result)
        except Exception as exc:  # noqa: BLE001 - user code
            if isinstance(exc, QueueError) and not _is_contract_error(exc):
                raise
            staged, counts = self.handled(snapshot, exc)
            outcome, error = "error", f"{type(exc).__name__}: {exc}"
        self.hook("after_prepare")
        from cues_platform.processing.outputs import commit_unguarded

        for qname, parts in sorted(staged.items()):
            commit_unguarded(self.queues[qname], snapshot, parts, message_type="error" if error else "message")
            self.hook("between_commits")
        remove_staging(self.lake, snapshot)
        self.hook("after_commit")
        if self.strategy is Strategy.AT_LEAST_ONCE:
            # Step 3 (at_least_once)
            self._commit_positions(snapshot)
        self.advance(snapshot)
        rows = {q: sum(p.values()) for q, p in counts.items()}
        return StepResult(snapshot.step, snapshot.delivery_hash, outcome if staged else "nil",
                          snapshot.inputs, snapshot.rows, rows, error)


def make_stepper(**kwargs: Any) -> StepBase:
    strategy = kwargs["processor"].strategy
    if strategy is Strategy.EXACTLY_ONCE:
        return ExactlyOnceStepper(**kwargs)
    return PositionStepper(strategy=strategy, **kwargs)


__all__ = ["PositionStepper", "make_stepper"]
