"""Source and imperative processors: user code that appends (and reads) itself.

A source step calls ``fn(ctx)`` and delivers what it returns. Delivery contract of a step:

1. The step number is the processor's saved step counter (position store key ``_steps``; on a
   lake written by an older version without it: the lowest next producer sequence of its output
   queues).
2. Call ``fn(ctx)``. ``None``, or nothing but empty tables, means "nothing to produce now": not a
   step (the counter does not move).
3. Append each non-empty output to its queue in one commit carrying the app transaction
   ``proc:{processor} = step`` and the step's delivery hash; a queue that already has this step
   (or a later one) is skipped. An output that is empty for this step writes nothing and leaves
   no gap: the check is "the queue's ``proc:`` version >= step", not a dense sequence.
4. Save the next step number.

A crash before step 4 calls the function again with the same ``ctx.step`` and delivers each
queue's output once. Make the function deterministic in ``ctx.step`` (e.g. read an external
offset derived from it) and a source delivers exactly once; otherwise a step interrupted after one
output queue's commit but before another's keeps the first queue's data from the first call.

An imperative step calls ``fn(ctx)`` with raw tailers and producers and promises nothing itself.
"""

from __future__ import annotations

from typing import Any

from cues_platform.processing.backing import Snapshot
from cues_platform.processing.model import Kind
from cues_platform.processing.outputs import commit_once, partitioned, split_outputs, to_arrow
from cues_platform.processing.step import StepBase, StepResult, without_metadata
from cues_platform.processing.strategies import STEPS_KEY
from cues_platform.queues.layout import PRODUCER
from cues_platform.queues.positions import PositionStore


class SourceStepper(StepBase):
    _store: PositionStore | None = None

    @property
    def store(self) -> PositionStore:
        if self._store is None:
            self._store = PositionStore(self.lake)
        return self._store

    def recover(self) -> StepResult | None:
        # Step 1
        saved = None
        if self.processor.kind is Kind.SOURCE:
            saved = self.store.get(queue=STEPS_KEY, tailer=self.processor.id, partition="0")
        if saved is None:  # an imperative processor, or a source last run by an older version
            seqs = []
            for o in self.processor.outputs.values():
                last = self.queues[o.queue].refresh().transaction_version(PRODUCER.id(self.processor.id))
                seqs.append(0 if last is None else int(last) + 1)
            saved = min(seqs, default=0)
        self.next_step = saved
        return None

    def step(self) -> StepResult | None:
        snapshot = Snapshot(self.processor.id, self.next_step, {})
        if self.processor.kind is Kind.IMPERATIVE:
            did = self.processor.fn(self.context(snapshot))
            self.next_step += 1
            return StepResult(snapshot.step, snapshot.delivery_hash, "nil", {}, 0) if did else None
        # Step 2
        return self.deliver(snapshot, self.processor.fn(self.context(snapshot)))

    def deliver(self, snapshot: Snapshot, result: Any) -> StepResult | None:
        """Steps 2-4 after the function returned ``result`` (also the function face's delivery,
        ``phased.py``): None when it produced nothing (not a step)."""
        outputs = split_outputs(result, self.processor.outputs, processor=self.processor.id)
        tables: dict[str, dict[str, Any]] = {}
        for binding, value in outputs.items():
            out = self.processor.outputs[binding]
            table = without_metadata(to_arrow(value))
            if table.num_rows:
                for part, t in partitioned(table, out, self.queues[out.queue]).items():
                    tables.setdefault(out.queue, {})[part] = t
        if not tables:
            return None  # nothing to produce now: not a step
        # Step 3
        rows: dict[str, int] = {}
        for qname, parts in sorted(tables.items()):
            res = commit_once(self.queues[qname], snapshot, parts, prepared=False)
            rows[qname] = 0 if res.duplicate else sum(t.num_rows for t in parts.values())
            self.hook("between_commits")
        # Step 4
        self.store.commit(queue=STEPS_KEY, tailer=self.processor.id, partition="0", position=snapshot.step + 1)
        self.next_step += 1
        return StepResult(snapshot.step, snapshot.delivery_hash, "output", {}, 0, rows)

def is_source_like(kind: Any) -> bool:
    return kind in (Kind.SOURCE, Kind.IMPERATIVE)
