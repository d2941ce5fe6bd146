"""The faster strategies, and picking a stepper by strategy.

at_least_once (Kafka's "process, then save the position"; ``PositionStepper.step``):

1. Plan ranges from the tailer positions (one durable tailer per input, named after the processor),
   or, when a plan for this step number is already saved (an earlier run of this step crashed),
   take exactly that plan: the re-run covers the same ranges under the same step number and
   delivery hash, however much data arrived since (sinks keyed by step, such as
   ``write_delta_once``, then skip it without losing rows).
2. Save the plan (step number and the planned end of every input) in ONE position-store commit.
3. Read, run the function, materialize its result once and conform it to the output queues, in
   memory (nothing is staged: :meth:`StepBase.keep`).
4. Append each output queue's rows straight from memory in one commit per queue (with the delivery
   hash; no backing record, no staged file, no re-read, no step check).
5. Commit the tailer positions and the next step number (one commit).

A crash before 4 leaves no output (the re-run recomputes the saved plan); a crash between 4 and 5
(or between two queues' commits of 4) re-runs the step on restart: its committed outputs appear
twice, with the same delivery hash, and nothing is lost.

at_most_once ("save the position, then process"):

1. Plan ranges; 2. commit the tailer positions; 3. read, run, materialize (in memory);
4. append each output queue's rows straight from memory.

A crash between 2 and the end of 4 loses the step's inputs; nothing is ever duplicated.
Errors with an error queue go there (once per attempt); without one the processor stops. A
platform failure (not the function's own error) raises :class:`PlatformStepError` and writes no
error row: at_least_once retries the step on the next start, at_most_once has lost it.
"""

from __future__ import annotations

from typing import Any

from cues_platform.processing.backing import Range, Snapshot
from cues_platform.processing.model import Kind, Strategy
from cues_platform.processing.outputs import commit_direct
from cues_platform.processing.step import ExactlyOnceStepper, StepBase, StepResult
from cues_platform.queues.positions import PositionStore

STEPS_KEY = "_steps"  # position-store key of a processor's next step number (not a queue name)
PLANNED_KEY = "_planned"  # key of (the step number + 1) whose plan is saved (at_least_once)
PLAN_END_KEY = "_plan_end"  # key (partition = "{queue}/{partition}" read) of the saved plan's end


def plan_end_key(queue: str, partition: str) -> str:
    """The position-store partition of a saved plan's end on ``queue``/``partition`` (keyed by what
    is read, not by the binding's name, which a redeploy may point elsewhere)."""
    return f"{queue}/{partition}"


class PositionStepper(StepBase):
    """at_least_once and at_most_once: tailer positions instead of a backing queue."""

    def __init__(self, *, strategy: Strategy, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.strategy = strategy
        self.store = PositionStore(self.lake)
        self.saved_plan: Snapshot | None = None

    def recover(self) -> StepResult | None:
        pid = self.processor.id
        for binding, src in self.processor.inputs.items():
            got = self.store.get(queue=src.queue, tailer=pid, partition=src.partition)
            self.positions[binding] = self.first_offset(binding) if got is None else got
        # Step numbers go on across restarts (sinks key their effects by step and delivery hash).
        self.next_step = self.store.get(queue=STEPS_KEY, tailer=pid, partition="0") or 0
        self.saved_plan = None
        if self.strategy is Strategy.AT_LEAST_ONCE and self.store.get(
                queue=PLANNED_KEY, tailer=pid, partition="0") == self.next_step + 1:
            # A run of this step planned it and did not finish: re-run exactly that plan.
            ranges = {}
            for binding, src in self.processor.inputs.items():
                end = self.store.get(queue=PLAN_END_KEY, tailer=pid,
                                     partition=plan_end_key(src.queue, src.partition))
                if end is None:  # a plan saved before plans were keyed by what they read
                    end = self.store.get(queue=PLAN_END_KEY, tailer=pid, partition=binding)
                start = self.positions[binding]
                ranges[binding] = Range(src.queue, src.partition, start, start if end is None else end)
            alts = None
            if self.processor.kind is Kind.ALTS:
                alts = next((b for b, r in ranges.items() if r.size), None)
            self.saved_plan = Snapshot(pid, self.next_step, ranges, alts)
        return None

    def _commit_positions(self, snapshot: Snapshot) -> None:
        # One atomic commit: the step counter and every input position (the step counter never
        # lags the positions, so a delivered step's number is never reused).
        self.store.commit_many(
            [(STEPS_KEY, self.processor.id, "0", snapshot.step + 1)]
            + [(r.queue, self.processor.id, r.partition, r.end) for r in snapshot.inputs.values() if r.size]
        )

    def _save_plan(self, snapshot: Snapshot) -> None:
        pid = self.processor.id
        self.store.commit_many(
            [(PLANNED_KEY, pid, "0", snapshot.step + 1)]
            + [(PLAN_END_KEY, pid, plan_end_key(r.queue, r.partition), r.end)
               for r in snapshot.inputs.values()]
        )

    def begin(self) -> Snapshot | None:
        self.hook("before_snapshot")
        # Step 1
        self._planned = None  # only this begin's plans are read by step 3
        snapshot, self.saved_plan = self.saved_plan, None
        if snapshot is None:
            snapshot = self.plan_snapshot()
            if snapshot is None:
                return None
            if self.strategy is Strategy.AT_LEAST_ONCE:
                # Step 2 (at_least_once)
                self._save_plan(snapshot)
        if self.strategy is Strategy.AT_MOST_ONCE:
            # Step 2 (at_most_once)
            self._commit_positions(snapshot)
        self.hook("after_snapshot")
        return snapshot

    def complete(self, snapshot: Snapshot, prepared: tuple[dict, dict, Exception | None]) -> StepResult:
        # (Step 3 was ``prepared``: read, run, materialize and conform, in memory)
        outputs, counts, exc = prepared
        error = None if exc is None else f"{type(exc).__name__}: {exc}"
        self.hook("after_prepare")
        # Step 4
        for qname, tables in sorted(outputs.items()):
            commit_direct(self.queues[qname], snapshot, tables, message_type="error" if error else "message")
            self.hook("between_commits")
        self.hook("after_commit")
        if self.strategy is Strategy.AT_LEAST_ONCE:
            # Step 5 (at_least_once)
            self._commit_positions(snapshot)
        self.advance(snapshot)
        rows = {q: sum(p.values()) for q, p in counts.items()}
        outcome = ("error" if error else "output") if outputs else "nil"
        return StepResult(snapshot.step, snapshot.delivery_hash, outcome,
                          snapshot.inputs, snapshot.rows, rows, error)


def make_stepper(**kwargs: Any) -> StepBase:
    strategy = kwargs["processor"].strategy
    if strategy is Strategy.EXACTLY_ONCE:
        return ExactlyOnceStepper(**kwargs)
    return PositionStepper(strategy=strategy, **kwargs)


__all__ = ["PositionStepper", "make_stepper"]
