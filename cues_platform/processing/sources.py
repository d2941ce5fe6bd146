"""Source and imperative processors: user code that appends (and reads) itself.

A source step calls ``fn(ctx)``; what it returns is appended through idempotent producers whose id
is the processor id and whose sequence is the step number, recorded in the same commit. The step
number on start is the producers' next sequence, so a step that crashed before its commit is
called again with the same ``ctx.step`` and delivered once; a committed step is never called again.
Make the function deterministic in ``ctx.step`` (e.g. read an external offset derived from it) and
a source delivers exactly once; otherwise a step interrupted after one output queue's commit but
before another's keeps the first queue's data (at-least-once across a source's outputs).

An imperative step calls ``fn(ctx)`` with raw tailers and producers and promises nothing itself.
"""

from __future__ import annotations

from typing import Any

from cues_platform.processing.backing import Snapshot
from cues_platform.processing.graph import Kind
from cues_platform.processing.outputs import partitioned, split_outputs, to_arrow
from cues_platform.processing.step import StepBase, StepResult


class SourceStepper(StepBase):
    def recover(self) -> StepResult | None:
        seqs = [self.queues[o.queue].producer(producer_id=self.processor.id).next_sequence
                for o in self.processor.outputs.values()]
        self.next_step = min(seqs, default=0)
        return None

    def step(self) -> StepResult | None:
        snapshot = Snapshot(self.processor.id, self.next_step, {})
        if self.processor.kind is Kind.IMPERATIVE:
            did = self.processor.fn(self.context(snapshot))
            self.next_step += 1
            return StepResult(snapshot.step, snapshot.delivery_hash, "nil", {}, 0) if did else None
        result = self.processor.fn(self.context(snapshot))
        outputs = split_outputs(result, self.processor.outputs, processor=self.processor.id)
        if not outputs:
            return None  # nothing to produce now: not a step
        rows: dict[str, int] = {}
        for binding, value in outputs.items():
            out = self.processor.outputs[binding]
            queue = self.queues[out.queue]
            table = to_arrow(value)
            if not table.num_rows:
                continue
            producer = queue.producer(producer_id=self.processor.id)
            res = producer.send_many(partitioned(table, out, queue), sequence=snapshot.step,
                                     delivery_hash=snapshot.delivery_hash)
            rows[out.queue] = rows.get(out.queue, 0) + (res.rows if not res.duplicate else 0)
        self.next_step += 1
        return StepResult(snapshot.step, snapshot.delivery_hash, "output", {}, 0, rows)


def is_source_like(kind: Any) -> bool:
    return kind in (Kind.SOURCE, Kind.IMPERATIVE)
