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

How long the work has waited (freshness, :func:`family_oldest_unread`): the first unread offset
of each input of each lane (its position, or the partition's start offset after retention) was
written by one Delta commit, whose entry names it (``cues.ranges``, written with every data commit
by the appender) and carries its time (``commitInfo.timestamp``, the writer's clock). The oldest of
them over a processor's lanes is its oldest unread row. The commit is found by a binary search
over the versions, reading commit entries only (each parsed once per process); when the log
cleanup removed the entry, the oldest entry still there gives a lower bound (``exact=False``).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from deltalake import DeltaTable

from cues_platform.processing.backing import BackingQueue, RecordType
from cues_platform.processing.graph import Graph
from cues_platform.processing.home import home_of, read_home
from cues_platform.processing.model import Kind, Processor, Strategy
from cues_platform.processing.sources import is_source_like
from cues_platform.queues import Lake
from cues_platform.queues.integrity import TableStorage, _parse_ranges, commit_path
from cues_platform.queues.positions import PositionStore

__all__ = ["LaneWork", "UnreadAge", "family_oldest_unread", "family_work", "graph_work", "lane_oldest_unread",
           "lane_work", "offset_commit", "source_wanted"]


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


# -- the age of the oldest unread row (freshness), from the Delta logs ------------------------------
@dataclass(frozen=True)
class UnreadAge:
    """The oldest unread row of a processor (the first unread offset of its laggiest lane).

    ``committed_ms``: the ``commitInfo.timestamp`` of the Delta version that wrote that offset (the
    writer's clock, epoch milliseconds). ``exact`` is False when that commit entry is gone (a log
    cleanup removed it): ``committed_ms`` is then the timestamp of the oldest commit entry still
    in the log, so the age computed from it is a lower bound. ``version`` is None in that case."""

    processor: str
    queue: str
    partition: str
    offset: int
    unread: int
    version: int | None
    committed_ms: int
    exact: bool = True

    def age_ms(self, now_ms: int) -> int:
        """``now_ms - committed_ms``, never negative (a writer's clock ahead of ``now_ms``'s)."""
        return max(0, now_ms - self.committed_ms)


@dataclass(frozen=True)
class _Commit:
    timestamp: int | None
    ranges: dict[str, tuple[int, int]]


_COMMITS: OrderedDict[tuple[str, str, int], _Commit] = OrderedDict()  # (uri, table id, version)
_COMMITS_MAX = 100_000  # a commit entry never changes: parsed once per process (sensor ticks)
_COMMITS_LOCK = threading.Lock()


def _commit(storage: TableStorage, table: tuple[str, str], version: int) -> _Commit | None:
    """What commit ``version`` says (timestamp, ``cues.ranges``), or None when its entry is gone."""
    key = (*table, version)
    with _COMMITS_LOCK:
        hit = _COMMITS.get(key)
        if hit is not None:
            _COMMITS.move_to_end(key)
            return hit
    raw = storage.read(commit_path(version))
    if raw is None:
        return None
    info: dict = {}
    for line in raw.splitlines():
        if line.strip().startswith(b'{"commitInfo"'):
            info = json.loads(line).get("commitInfo", {})
            break
    stamp = info.get("timestamp")
    entry = _Commit(int(stamp) if isinstance(stamp, int | float) else None,
                    _parse_ranges(info["cues.ranges"]) if isinstance(info.get("cues.ranges"), str) else {})
    with _COMMITS_LOCK:
        _COMMITS[key] = entry
        while len(_COMMITS) > _COMMITS_MAX:
            _COMMITS.popitem(last=False)
    return entry


def offset_commit(lake: Lake, queue: str, partition: str, offset: int) -> tuple[int | None, int, bool] | None:
    """``(version, commit timestamp ms, exact)`` of the Delta commit that wrote ``offset`` of
    ``queue``/``partition``, read from the commit entries only (each data commit names its offsets
    in ``cues.ranges``; offsets grow with versions, so a binary search over versions, each probe
    walking down to the nearest commit of the partition). When the commit's entry was removed by
    a log cleanup: ``(None, timestamp of the oldest entry still there, False)``, a lower bound on
    the age. None when no commit entry names the offset and none is missing (not written yet)."""
    q = lake.queue(queue)
    dt = q.refresh()
    storage = TableStorage(q.uri, lake.options)
    table = (q.uri, str(dt.metadata().id))
    lo, hi = 0, dt.version()
    oldest: tuple[int, int] | None = None  # (version, timestamp) of the oldest entry read
    gone = False
    while lo <= hi:
        mid = (lo + hi) // 2
        v, hit = mid, None
        while v >= lo:
            entry = _commit(storage, table, v)
            if entry is None:  # a cleanup removes the oldest entries first: all below are gone
                gone = True
                break
            if entry.timestamp is not None and (oldest is None or v < oldest[0]):
                oldest = (v, entry.timestamp)
            if partition in entry.ranges and entry.timestamp is not None:
                hit = (v, entry)
                break
            v -= 1
        if hit is None:
            lo = mid + 1
            continue
        version, entry = hit
        start, end = entry.ranges[partition]
        if start <= offset < end:
            return version, entry.timestamp, True  # type: ignore[return-value]
        if end <= offset:
            lo = mid + 1
        else:
            hi = version - 1
    if gone and oldest is not None:
        return None, oldest[1], False
    return None


def lane_oldest_unread(lake: Lake, proc: Processor, work: LaneWork,
                       bindings: Sequence[str] | None = None) -> UnreadAge | None:
    """The oldest unread row of lane ``proc`` (of ``bindings``, default every input), or None
    when it has read everything there."""
    best: UnreadAge | None = None
    for binding, unread in work.unread.items():
        if not unread or (bindings is not None and binding not in bindings):
            continue
        src = proc.inputs[binding]
        first = max(work.positions.get(binding, 0), _start(lake, src.queue, src.partition))
        if first >= work.ends[binding]:  # retention removed every unread row
            continue
        found = offset_commit(lake, src.queue, src.partition, first)
        if found is None:
            continue
        version, stamp, exact = found
        age = UnreadAge(proc.id, src.queue, src.partition, first, work.ends[binding] - first,
                        version, stamp, exact)
        if best is None or age.committed_ms < best.committed_ms:
            best = age
    return best


def family_oldest_unread(lake: Lake, graph: Graph, family: str,
                         works: Sequence[LaneWork] | None = None) -> UnreadAge | None:
    """The oldest unread row over every lane of processor ``family`` (its laggiest lane); for a
    source a join reads, the oldest row a join waits with for it (:func:`source_wanted`)."""
    declared = graph.as_declared(family)
    if declared.kind is Kind.SOURCE:
        return _waited_for(lake, graph, family)
    current = graph.with_lake_partitions({q: lake.queue(q).partitions for q in graph.queues
                                          if lake.has_queue(q)})
    lanes = [current.processors[pid] for pid in current.families.get(family, [family])]
    works = list(works) if works is not None else [lane_work(lake, p) for p in lanes]
    by_id = {p.id: p for p in lanes}
    best: UnreadAge | None = None
    for work in works:
        proc = by_id.get(work.processor)
        if proc is None or not proc.inputs:
            continue
        age = lane_oldest_unread(lake, proc, work)
        if age is not None and (best is None or age.committed_ms < best.committed_ms):
            best = age
    return best


def _waited_for(lake: Lake, graph: Graph, source: str) -> UnreadAge | None:
    """The oldest unread row of a join lane waiting for ``source`` (see :func:`source_wanted`)."""
    proc = graph.processors[source]
    outs = {o.queue for o in proc.outputs.values()}
    best: UnreadAge | None = None
    for reader in graph.processors.values():
        if reader.kind is not Kind.JOIN or not any(i.queue in outs for i in reader.inputs.values()):
            continue
        work = lane_work(lake, reader)
        mine = [b for b, i in reader.inputs.items() if i.queue in outs]
        others = [b for b in reader.inputs if b not in mine]
        unread = work.unread
        if work.pending or not others or not all(unread[b] for b in others) or any(unread[b] for b in mine):
            continue
        age = lane_oldest_unread(lake, reader, work, others)
        if age is not None and (best is None or age.committed_ms < best.committed_ms):
            best = age
    return best
