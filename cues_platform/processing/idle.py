"""Whether a processor has anything to do, read from the lake without Spark and without writing.

A processor lane has *work* when a step would follow a start, or recovery has something to finish:

- unread rows: an input queue partition's next offset is beyond the lane's position there (the
  position from where its strategy keeps it: the home queue's ``pos:`` app transactions for an
  exactly_once processor, the last backing record's ends for a sink, the position store for
  at_least_once/at_most_once). A map, join, fork or sink steps only when *every* input has unread
  rows (``StepBase.plan_snapshot``); an alts processor when any has;
- pending recovery: the backing queue's last record is beyond the home's step (an attempt to
  roll forward, or a recorded snapshot to retry), a sink's last record is a snapshot (a step in
  flight), or the home holds positions only under their legacy keys (recovery migrates them).

Nothing here commits: no fence, no backing queue created. Triggers key on this (the *lag*), never
on Delta versions: a fencing commit is empty, so it moves no next offset and no position, and an
idle processor's start cannot look like new data downstream.

A source has no input; it has work on demand (:func:`source_wanted`): when a join reading its
output waits for it (every other input of the join has unread rows, its own has none), which is
what the reference ``fx`` source publishes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deltalake import DeltaTable

from cues_platform.processing.backing import BackingQueue, RecordType
from cues_platform.processing.graph import Graph
from cues_platform.processing.home import home_of, read_home
from cues_platform.processing.model import Kind, Processor, Strategy
from cues_platform.processing.sources import is_source_like
from cues_platform.queues import Lake
from cues_platform.queues.positions import PositionStore

__all__ = ["LaneWork", "family_work", "graph_work", "lane_work", "source_wanted"]


@dataclass(frozen=True)
class LaneWork:
    """One lane's input state: ``ends`` (next offsets) and ``positions`` by binding, and why
    recovery has something to finish (``pending``: empty when nothing)."""

    processor: str
    kind: Kind
    ends: dict[str, int] = field(default_factory=dict)
    positions: dict[str, int] = field(default_factory=dict)
    pending: str = ""

    @property
    def unread(self) -> dict[str, int]:
        return {b: max(0, self.ends[b] - self.positions.get(b, 0)) for b in self.ends}

    @property
    def lag(self) -> int:
        return sum(self.unread.values())

    @property
    def steppable(self) -> bool:
        """Whether a step would follow (alts: any input has unread rows; others: every input)."""
        unread = self.unread
        if not unread:
            return False
        return any(unread.values()) if self.kind is Kind.ALTS else all(unread.values())

    @property
    def has_work(self) -> bool:
        return bool(self.pending) or self.steppable


def _backing(lake: Lake, pid: str) -> BackingQueue | None:
    """The lane's backing queue when it exists (never created here)."""
    uri = lake.system_uri("backing", pid)
    if not DeltaTable.is_deltatable(uri, storage_options=lake.options):
        return None
    return BackingQueue(lake, pid)


def _start(lake: Lake, queue: str, partition: str) -> int:
    q = lake.queue(queue)
    return q.start_offset(partition) if partition in q.partitions else 0


def lane_work(lake: Lake, proc: Processor) -> LaneWork:
    """What lane ``proc`` has to do (see the module docstring). Reads only: Delta logs and at most
    one backing record."""
    ends: dict[str, int] = {}
    for binding, src in proc.inputs.items():
        if not lake.has_queue(src.queue):
            ends[binding] = 0
            continue
        q = lake.queue(src.queue)
        ends[binding] = q.next_offset(src.partition) if src.partition in q.partitions else 0
    starts = {b: (_start(lake, s.queue, s.partition) if ends[b] else 0) for b, s in proc.inputs.items()}
    if is_source_like(proc.kind) or not proc.inputs:
        return LaneWork(proc.id, proc.kind)
    if proc.strategy is not Strategy.EXACTLY_ONCE:
        store = PositionStore(lake)
        positions = {b: store.get(queue=s.queue, tailer=proc.id, partition=s.partition) or starts[b]
                     for b, s in proc.inputs.items()}
        return LaneWork(proc.id, proc.kind, ends, positions)
    backing = _backing(lake, proc.id)
    last = backing.last_record() if backing is not None else None
    home = home_of(proc)
    if home is None:  # a sink: its positions are its last record's ends
        if last is None:
            return LaneWork(proc.id, proc.kind, ends, starts)
        ranges = {(r.queue, r.partition): r.end for r in last.snapshot.inputs.values()}
        positions = {b: ranges.get((s.queue, s.partition), starts[b]) for b, s in proc.inputs.items()}
        pending = (f"step {last.step} was recorded (snapshot) and not delivered"
                   if last.type is RecordType.SNAPSHOT else "")
        return LaneWork(proc.id, proc.kind, ends, positions, pending)
    if not lake.has_queue(home):
        pending = f"backing record of step {last.step} and no home queue {home!r}" if last else ""
        return LaneWork(proc.id, proc.kind, ends, starts, pending)
    state = read_home(lake.queue(home), proc)
    positions = {b: starts[b] if v is None else v for b, v in state.positions.items()}
    pending = ""
    if last is not None and last.step > state.step:
        pending = (f"backing {last.type.value} of step {last.step} beyond the home's step "
                   f"{state.step} in {home!r}")
    elif state.step >= 0 and not state.keyed:
        pending = f"positions in {home!r} under their legacy keys (recovery migrates them)"
    return LaneWork(proc.id, proc.kind, ends, positions, pending)


def family_work(lake: Lake, graph: Graph, family: str) -> list[LaneWork]:
    """:func:`lane_work` of each lane of the declared processor ``family``, those of partitions
    added to its input queues since ``graph`` was built included."""
    current = graph.with_lake_partitions({q: lake.queue(q).partitions for q in graph.queues
                                          if lake.has_queue(q)})
    return [lane_work(lake, current.processors[pid]) for pid in current.families.get(family, [family])]


def source_wanted(lake: Lake, graph: Graph, source: str) -> str:
    """Why source ``source`` should run now (empty: it should not): a join lane reading one of its
    output queues has unread rows on every other input and none on the source's, and nothing to
    recover."""
    proc = graph.processors[source]
    outs = {o.queue for o in proc.outputs.values()}
    for reader in graph.processors.values():
        if reader.kind is not Kind.JOIN or not any(i.queue in outs for i in reader.inputs.values()):
            continue
        work = lane_work(lake, reader)
        if work.pending:
            continue
        mine = [b for b, i in reader.inputs.items() if i.queue in outs]
        others = [b for b in reader.inputs if b not in mine]
        unread = work.unread
        if others and all(unread[b] for b in others) and not any(unread[b] for b in mine):
            return (f"join {reader.id!r} has unread rows on {', '.join(others)} and has read "
                    f"everything of {', '.join(sorted(outs))}")
    return ""


def graph_work(lake: Lake, graph: Graph) -> dict[str, str]:
    """Every declared processor of ``graph`` with work, and why (empty: the lake is drained)."""
    out: dict[str, str] = {}
    for family in graph.family_order():
        proc = graph.as_declared(family)
        if is_source_like(proc.kind) or not proc.inputs:
            why = source_wanted(lake, graph, family) if proc.kind is Kind.SOURCE else ""
            if why:
                out[family] = why
            continue
        for work in family_work(lake, graph, family):
            if work.has_work:
                out[family] = work.pending or f"lag {work.lag} on {work.unread}"
                break
    return out
