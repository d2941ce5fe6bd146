"""Which changes of a graph between runs a lake can continue exactly once (Flink's savepoint
compatibility, by processor id).

A processor's state in the lake is keyed by its id (a lane's id for one lane): its step counter,
epoch and input positions (``processing/home.py``, keyed by queue and partition read), its
backing queue, or, for at_least_once/at_most_once, its tailer positions (``strategies.py``). So a
new graph continues a processor exactly when the same id reads the same queue partitions with
the same strategy and keeps its positions in the same home queue. The *registry*
(``{lake}/_cues/deployments``, one row per processor id: strategy, home queue, the (binding,
queue, partition) it reads) remembers what each id was deployed as, so that a start can tell a
change that continues from one that would silently re-deliver or skip input.

Contract of :func:`check_and_record` (before any step of a graph; every face calls it: the
runner at start and for every lane it adds, and each stepper's recovery for the processors it
steps):

1. Shapes: the current graph's processors (lanes) as :class:`Shape`; the previous ones from the
   registry, or, for ids the registry has never seen (a lake written before it), derived from
   their step history (exactly_once; at_least_once/at_most_once ids are learnt from their first
   start with this version on).
2. Continued, nothing to check: the same id, strategy and home; an input added (a queue partition
   it never read starts at offset 0), removed (its position stays, unused), renamed (positions
   are keyed by queue and partition, not by binding name) or pointed at another queue or
   partition that no processor of its family ever read (offset 0: the input is new to it).
3. Refused with :class:`~cues_platform.processing.errors.RedeployError` (a subclass per change)
   naming the change and the ways out, before anything is written:
   a. a queue partition the processor would read for the first time, which another processor of
      its family (a lane of the same declared processor, under this graph or an earlier one)
      read and no longer reads (every-partition <-> named partition, a named partition moved
      between lanes): the new reader would start at offset 0 (re-delivery) while the old
      reader's position stays behind (:class:`LaneMigrationError`). A partition read by both
      now (a broadcast side such as rates, one position per lane) is no move;
   b. the strategy changed after the processor made progress (the positions of the other
      strategy are elsewhere: :class:`StrategyChangedError`);
   c. an exactly_once processor's home queue (its first output) changed after it delivered a
      step: its positions are stored in the old home (:class:`HomeChangedError`);
   d. a processor id new to the lake whose home queue and inputs match a processor id the graph
      no longer has, which read them: most likely a rename (:class:`ProcessorRenamedError`).
4. Recorded: the current shapes replace the registry rows of their ids (one merge commit, only
   when something changed), so the next start compares with this deployment.

Ways out, always offered: keep the old binding/id/strategy/first output; or, to re-deliver on
purpose, forget the old processor's state (:func:`forget`, ``cues processor forget ID --yes``), after
which its positions no longer count.

The registry rows are owned by their processor ids. Nothing deletes them by age: an id idle for a
year keeps its row, as its positions keep their meaning. :func:`forget` (an operator's decision)
deletes one together with the id's backing queue.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from cues_platform.processing.discovery import backing_folders
from cues_platform.processing.errors import (
    HomeChangedError,
    LaneMigrationError,
    ProcessorRenamedError,
    RedeployError,
    StrategyChangedError,
)
from cues_platform.processing.graph import Graph
from cues_platform.processing.history import processor_history
from cues_platform.processing.home import home_of
from cues_platform.processing.lanes import family_of
from cues_platform.processing.model import Processor, Strategy
from cues_platform.processing.sources import is_source_like
from cues_platform.processing.strategies import STEPS_KEY
from cues_platform.queues import Lake
from cues_platform.queues.layout import LANE_POSITION, LEGACY_LANE_POSITION, PROCESSOR_STEP
from cues_platform.queues.names import validate_processor_id
from cues_platform.queues.positions import PositionStore, open_system_table

REGISTRY = "deployments"
SCHEMA = pa.schema([
    pa.field("processor", pa.string(), nullable=False),
    pa.field("family", pa.string(), nullable=False),
    pa.field("strategy", pa.string(), nullable=False),
    pa.field("home", pa.string(), nullable=True),
    pa.field("inputs", pa.string(), nullable=False),  # JSON [[binding, queue, partition], ...]
    pa.field("graph", pa.string(), nullable=False),
    pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),  # for humans only
])
MERGE_ATTEMPTS = 50

Pair = tuple[str, str]  # (queue, partition)


@dataclass(frozen=True)
class Shape:
    """What a processor id reads, how, and where it keeps its positions."""

    processor: str
    strategy: str
    home: str | None
    inputs: tuple[tuple[str, str, str], ...]  # sorted (binding, queue, partition)
    # positions known from a derived history (lakes older than the registry), by (queue, partition)
    ends: Mapping[Pair, int] = field(default_factory=dict, compare=False)

    @property
    def family(self) -> str:
        return family_of(self.processor)

    @property
    def reads(self) -> set[Pair]:
        return {(q, p) for _, q, p in self.inputs}

    def binding_of(self, pair: Pair) -> str | None:
        return next((b for b, q, p in self.inputs if (q, p) == pair), None)

    @classmethod
    def of(cls, p: Processor) -> Shape:
        return cls(p.id, p.strategy.value, home_of(p) if p.strategy is Strategy.EXACTLY_ONCE else None,
                   tuple(sorted((b, s.queue, s.partition) for b, s in p.inputs.items())))


def _is_source(p: Processor) -> bool:
    return is_source_like(p.kind) or not p.inputs


class Registry:
    """The lake's ``_cues/deployments`` table: the last recorded :class:`Shape` of every id."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.uri = lake.system_uri(REGISTRY)

    def _table(self) -> DeltaTable:
        return open_system_table(self.lake, REGISTRY, SCHEMA)

    def shapes(self) -> dict[str, Shape]:
        if not DeltaTable.is_deltatable(self.uri, storage_options=self.lake.options):
            return {}
        rows = self._table().to_pyarrow_table().to_pylist()
        return {r["processor"]: Shape(r["processor"], r["strategy"], r["home"],
                                      tuple(tuple(i) for i in json.loads(r["inputs"])))
                for r in rows}

    def record(self, shapes: Iterable[Shape], *, graph: str) -> None:
        """Replace the rows of ``shapes``' ids (one merge commit; retried on a conflict)."""
        shapes = list(shapes)
        if not shapes:
            return
        now = datetime.now(UTC)
        source = pa.table({
            "processor": [s.processor for s in shapes], "family": [s.family for s in shapes],
            "strategy": [s.strategy for s in shapes], "home": [s.home for s in shapes],
            "inputs": [json.dumps([list(i) for i in s.inputs]) for s in shapes],
            "graph": [graph] * len(shapes), "recorded_at": [now] * len(shapes)}, schema=SCHEMA)
        for _ in range(MERGE_ATTEMPTS):
            try:
                (self._table().merge(source, predicate="t.processor = s.processor",
                                     source_alias="s", target_alias="t")
                 .when_matched_update_all().when_not_matched_insert_all().execute())
                return
            except CommitFailedError:
                continue
        raise RedeployError(f"graph {graph!r}: could not record its processors in {self.uri}; "
                            "other starts keep changing it, start again", uri=self.uri, retryable=True)

    def delete(self, processor: str) -> bool:
        if not DeltaTable.is_deltatable(self.uri, storage_options=self.lake.options):
            return False
        for _ in range(MERGE_ATTEMPTS):
            try:
                metrics = self._table().delete(f"processor = '{validate_processor_id(processor)}'")
                return bool(metrics.get("num_deleted_rows"))
            except CommitFailedError:
                continue
        raise RedeployError(f"could not delete processor {processor!r} from {self.uri}; try again",
                            processor=processor, retryable=True)


def derived_shape(lake: Lake, processor_id: str) -> Shape | None:
    """The shape of an exactly_once id the registry never saw (a lake written before it), from its
    last recorded step (None when it has none)."""
    history = [r for r in processor_history(lake, processor_id) if r.is_attempt]
    if not history:
        return None
    last = history[-1].snapshot.inputs
    ends: dict[Pair, int] = {}
    for r in history:
        for rng in r.snapshot.inputs.values():
            ends[(rng.queue, rng.partition)] = max(ends.get((rng.queue, rng.partition), 0), rng.end)
    inputs = tuple(sorted((b, r.queue, r.partition) for b, r in last.items()))
    return Shape(processor_id, Strategy.EXACTLY_ONCE.value, None, inputs, ends)


def progress(lake: Lake, shape: Shape, pair: Pair) -> int:
    """How far ``shape.processor`` read ``pair`` (0: never), from where its strategy keeps it."""
    if pair in shape.ends:
        return shape.ends[pair]
    if shape.strategy != Strategy.EXACTLY_ONCE.value:
        return PositionStore(lake).get(queue=pair[0], tailer=shape.processor, partition=pair[1]) or 0
    if shape.home is None or not lake.has_queue(shape.home):
        derived = derived_shape(lake, shape.processor)
        return derived.ends.get(pair, 0) if derived else 0
    home = lake.queue(shape.home)
    dt = home.refresh()
    stored = home.txn_version(LANE_POSITION.id(shape.processor, *pair), snapshot=dt)
    if stored is None and (binding := shape.binding_of(pair)) is not None:
        stored = home.txn_version(LEGACY_LANE_POSITION.id(shape.processor, binding), snapshot=dt)
    return int(stored or 0)


def _delivered(lake: Lake, shape: Shape) -> bool:
    """Whether ``shape.processor`` delivered (or, for the position strategies, planned) a step."""
    if shape.strategy != Strategy.EXACTLY_ONCE.value:
        return bool(PositionStore(lake).get(queue=STEPS_KEY, tailer=shape.processor, partition="0"))
    if shape.ends:
        return True
    if shape.home is not None and lake.has_queue(shape.home):
        return lake.queue(shape.home).txn_version(PROCESSOR_STEP.id(shape.processor)) is not None
    return derived_shape(lake, shape.processor) is not None


def _ways_out(*extra: str, forget: str) -> str:
    return "; ".join([*extra, f"or, to deliver that input again on purpose, `cues processor forget "
                               f"{forget} --yes` first (its state no longer counts)"])


def check(graph: Graph, lake: Lake, *, only: Iterable[str] | None = None,
          registry: Mapping[str, Shape] | None = None) -> list[Shape]:
    """Steps 1-3 for the processors ``only`` (default: all) of ``graph``; returns their shapes."""
    registry = Registry(lake).shapes() if registry is None else registry
    ids = [pid for pid in (only or graph.processors) if not _is_source(graph.processors[pid])]
    current = {pid: Shape.of(graph.processors[pid]) for pid in graph.processors
               if not _is_source(graph.processors[pid])}
    families = {family_of(pid) for pid in ids}
    # Step 1: every earlier shape of these families (registry, else derived from history)
    earlier: dict[str, Shape] = {pid: s for pid, s in registry.items() if s.family in families}
    backing = {pid for pid in backing_folders(lake) if family_of(pid) in families
               and DeltaTable.is_deltatable(lake.system_uri("backing", pid), storage_options=lake.options)}
    for pid in sorted(backing):
        if pid not in registry:
            derived = derived_shape(lake, pid)
            if derived is not None:
                earlier[pid] = derived
    for pid in ids:
        new = current[pid]
        old = earlier.get(pid)
        if old is not None and old.strategy != new.strategy and _delivered(lake, old):  # Step 3b
            raise StrategyChangedError(
                f"processor {pid!r} ran {old.strategy} and is now {new.strategy}: its positions are "
                f"kept where {old.strategy} keeps them, so {new.strategy} would read its input again "
                f"from offset 0. Ways out: {_ways_out(f'keep Options(strategy={old.strategy!r})', forget=pid)}",
                processor=pid, change="strategy", before=old.strategy, after=new.strategy)
        if (old is not None and old.home is not None and new.home is not None and old.home != new.home
                and _delivered(lake, old)):  # Step 3c
            raise HomeChangedError(
                f"processor {pid!r} keeps its steps and positions in its first output's queue "
                f"{old.home!r}, but its first output is now {new.home!r}: it would start over at "
                f"step 0 and offset 0. Ways out: {_ways_out(f'keep an output to {old.home!r} first', forget=pid)}",
                processor=pid, change="home", before=old.home, after=new.home)
        moved = []
        for pair in sorted(new.reads - (old.reads if old else set())):  # Step 3a
            for other, shape in sorted(earlier.items()):
                if other == pid or pair not in shape.reads:
                    continue
                if other in current and pair in current[other].reads:
                    continue  # read by both now: a broadcast side, one position each
                at = progress(lake, shape, pair)
                if at:
                    moved.append((pair, other, at))
        if moved:
            where = ", ".join(f"{q}/{p} (read by {o} up to offset {at})" for (q, p), o, at in moved)
            raise LaneMigrationError(
                f"processor {pid!r} would read {where} for the first time: positions belong to the "
                f"processor that read them, so {pid!r} would start at offset 0 and deliver that input "
                f"again, and {moved[0][1]!r} would no longer read on. Ways out: "
                + _ways_out("keep the previous bindings (In(queue) for every partition, or the same "
                            "named partition under the same processor)",
                            "run this graph on a fresh lake", forget=moved[0][1]),
                processor=pid, change="position", pairs=[f"{q}/{p}" for (q, p), _, _ in moved],
                owners=sorted({o for _, o, _ in moved}), path=lake.system_uri("backing", moved[0][1]))
        if old is None and pid not in backing and new.home is not None:  # Step 3d
            for other, shape in sorted(registry.items()):
                if (family_of(other) in graph.families or shape.home != new.home
                        or not (shape.reads & new.reads)):
                    continue
                shared = sorted(shape.reads & new.reads)
                if any(progress(lake, shape, pair) for pair in shared):
                    raise ProcessorRenamedError(
                        f"processor {pid!r} is new to this lake, but processor {other!r}, which this "
                        f"graph no longer has, wrote the same queue {new.home!r} from the same input "
                        f"({', '.join(f'{q}/{p}' for q, p in shared)}): if {pid!r} is {other!r} renamed "
                        f"it would deliver that input again. Ways out: "
                        + _ways_out(f"keep the id {other!r}", forget=other),
                        processor=pid, change="rename", before=other)
    return [current[pid] for pid in ids]


def check_and_record(graph: Graph, lake: Lake, *, only: Iterable[str] | None = None) -> None:
    """Steps 1-4 (see the module docstring)."""
    known = Registry(lake).shapes()  # read once: the check and the record compare with it
    shapes = check(graph, lake, only=only, registry=known)
    changed = [s for s in shapes if known.get(s.processor) != s]
    Registry(lake).record(changed, graph=graph.name)


def forget(lake: Lake, processor_id: str) -> list[str]:
    """Forget ``processor_id``'s state: its registry row and its backing queue (snapshots,
    attempts, digests). Its positions in a home queue stay as app transactions but no longer
    count for any check. Returns what was removed."""
    validate_processor_id(processor_id)
    removed: list[str] = []
    uri = lake.system_uri("backing", processor_id)
    if not lake.is_local:
        raise RedeployError(f"forgetting a processor on an object store is not supported here: "
                            f"delete {uri} with the store's own tools, then run this again",
                            processor=processor_id, uri=uri)
    if Registry(lake).delete(processor_id):
        removed.append(f"registry row {processor_id!r}")
    if lake.local_path(uri).exists():
        shutil.rmtree(lake.local_path(uri))
        removed.append(uri)
    return removed
