"""Graphs: processors, the queues between them, options — validated when built.

A processor binds names to queues: ``inputs={"orders": In("orders")}`` reads every partition of
``orders`` (one lane per partition, ``processing/lanes.py``), ``In("orders", "eu")`` one partition;
``outputs={"out": Out("enriched")}`` writes the lane's partition (``"0"`` outside lanes),
``Out("enriched", "eu")`` one named partition, ``Out("results", partition_column="sender")`` routes
rows by a column. Kinds follow Cues: source, map, join, alts, fork, sink, imperative.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import pyarrow as pa

from cues_platform.processing.errors import GraphError
from cues_platform.processing.lanes import ALL_PARTITIONS, SAME_PARTITION, expand
from cues_platform.queues.names import validate_name, validate_partition, validate_processor_id


class Kind(StrEnum):
    SOURCE = "source"
    MAP = "map"
    JOIN = "join"
    ALTS = "alts"
    FORK = "fork"
    SINK = "sink"
    IMPERATIVE = "imperative"


class Strategy(StrEnum):
    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"
    AT_MOST_ONCE = "at_most_once"


class SnapshotAt(StrEnum):
    """When an exactly_once step records its snapshot (its input ranges and delivery hash).

    ``commit``: with its output, in the step's one home commit (the default for every kind but a
    sink): a step that crashed before its commit left nothing, and the restart plans it again,
    possibly over longer ranges under another hash. ``read``: in the backing queue before the
    function runs (always for a sink): a restart retries exactly that snapshot with the same hash.
    Choose ``read`` for a map/join/alts/fork whose function has effects outside its outputs keyed
    by ``ctx.delivery_hash`` (a database write with ``postgres_once``): the retry must present
    the same hash so that the effect is recognised as done."""

    COMMIT = "commit"
    READ = "read"


class OutputWriter(StrEnum):
    """Who writes a step's output rows (``processing/executor_output.py``).

    ``executors``: Spark's executors write the Parquet files, with offsets and the other metadata
    columns computed in Spark, and the driver commits them by reference (it reads only their
    footers): no row crosses the driver. ``driver``: the result is collected to the driver as
    Arrow, conformed and written there. ``auto`` (default): executors for a step that reads more
    than ``AUTO_EXECUTOR_ROWS`` (1,000,000) input rows, the driver up to that (measured on two
    local cores, the driver's Arrow + delta-rs write is faster; above it the driver's memory
    would grow with the step). Either way the result is the same
    rows, offsets and commit; a step whose output cannot be written by the executors (not a Spark
    DataFrame, several outputs, a partition column, a pandera contract, column types other than
    the queue's) is written by the driver."""

    AUTO = "auto"
    EXECUTORS = "executors"
    DRIVER = "driver"


class AssetBody(StrEnum):
    """What a processor's Dagster asset runs (``cues_platform.dagster``); ``cues run`` ignores it.

    ``runner``: the platform's runner (recovery, then steps until the inputs are drained or a
    bound of the run config is hit), the function called once per step inside it.
    ``function``: the asset body IS the processor function, called once per materialization
    (``@processor_asset``): the step IO manager loads the inputs as the step's queue ranges and
    delivers the returned frame with the step's delivery hash. One materialization, one step."""

    RUNNER = "runner"
    FUNCTION = "function"


@dataclass(frozen=True)
class QueueDef:
    name: str
    schema: pa.Schema
    partitions: tuple[str, ...] = ("0",)
    contract: Any = None  # pandera: pandas (row by row in the step) or pyspark (the Dagster check)


@dataclass(frozen=True)
class In:
    queue: str
    partition: str = ALL_PARTITIONS  # default: every partition, one lane each (processing/lanes.py)


@dataclass(frozen=True)
class Out:
    queue: str
    partition: str | None = SAME_PARTITION  # default: the lane's partition ("0" outside lanes)
    partition_column: str | None = None  # route each row by this payload column instead


@dataclass(frozen=True)
class Options:
    batch_size: int = 10_000
    # a processor more than 10 x batch_size behind reads up to this many offsets per step
    # (processing/batching.py); set it to batch_size for fixed-size steps
    max_batch_size: int = 1_000_000
    poll_interval: float = 0.5
    strategy: Strategy = Strategy.EXACTLY_ONCE
    snapshot_at: SnapshotAt = SnapshotAt.COMMIT  # exactly_once; a sink always records at read
    output_writer: OutputWriter = OutputWriter.AUTO
    backing_maintenance_every: int = 1_000  # steps between backing-queue compactions; 0: never
    # lanes (one per partition of an every-partition input) of a map, join, alts or fork that step
    # at the same time in one runner (threads; Spark runs their jobs side by side); 1: in turn.
    # bench/bench_lanes.py: 2 lanes in parallel ~2x the throughput of in turn on 2 cores
    lane_workers: int = 4


@dataclass(frozen=True)
class Processor:
    id: str
    kind: Kind
    fn: Callable[..., Any]
    inputs: Mapping[str, In] = field(default_factory=dict)
    outputs: Mapping[str, Out] = field(default_factory=dict)
    error_queue: str | None = None
    options: Options = field(default_factory=Options)
    description: str = ""
    asset_body: AssetBody = AssetBody.RUNNER
    family: str | None = None  # set by Graph.build: the id the user gave (a lane's processor)
    lane: str | None = None  # set by Graph.build: the partition this lane reads (None: no lanes)

    @property
    def strategy(self) -> Strategy:
        return self.options.strategy

    @property
    def doc(self) -> str:
        return self.description or inspect.getdoc(self.fn) or ""


@dataclass(frozen=True)
class Graph:
    """Processors and queues, validated on construction."""

    name: str
    queues: Mapping[str, QueueDef]
    processors: Mapping[str, Processor]
    error_queue: str | None = None
    options: Options = field(default_factory=Options)
    declared: tuple[Processor, ...] = ()  # the processors as given to build(), before lanes

    def __post_init__(self) -> None:
        validate_graph(self)

    @classmethod
    def build(cls, *, name: str, queues: Sequence[QueueDef], processors: Sequence[Processor],
              error_queue: str | None = None, options: Options | None = None) -> Graph:
        qs: dict[str, QueueDef] = {}
        for q in queues:
            if q.name in qs:
                raise GraphError(f"graph {name!r}: queue {q.name!r} is declared twice", queue=q.name)
            qs[q.name] = q
        seen: set[str] = set()
        ps: dict[str, Processor] = {}
        for p in processors:
            if p.id in seen:
                raise GraphError(f"graph {name!r}: processor id {p.id!r} is used twice", processor=p.id)
            seen.add(p.id)
            validate_name(p.id, kind="processor")
            for lane in expand(p, qs):
                ps[lane.id] = lane
        return cls(name=name, queues=qs, processors=ps, error_queue=error_queue,
                   options=options or Options(), declared=tuple(processors))

    @property
    def families(self) -> dict[str, list[str]]:
        """Each processor the user declared -> the ids of its lanes (itself when it has none)."""
        out: dict[str, list[str]] = {}
        for p in self.processors.values():
            out.setdefault(p.family or p.id, []).append(p.id)
        return out

    def lanes_of(self, family: str) -> list[Processor]:
        """The lanes of processor ``family`` (as declared), in partition order."""
        lanes = [p for p in self.processors.values() if (p.family or p.id) == family]
        if not lanes:
            raise GraphError(f"graph {self.name!r} has no processor {family!r} (it has "
                             f"{sorted(self.families)})", processor=family)
        return lanes

    def family_order(self) -> list[str]:
        """The processors as declared (lanes folded into their processor), upstream first."""
        out: list[str] = []
        for pid in self.topological_order():
            family = self.processors[pid].family or pid
            if family not in out:
                out.append(family)
        return out

    def as_declared(self, family: str) -> Processor:
        """Processor ``family`` as one unit (what Dagster shows as one asset): itself when it has
        one lane of its own id, else its first lane under the declared id, with its every-partition
        bindings shown as ``In(queue, "*")``."""
        lanes = self.lanes_of(family)
        first = lanes[0]
        if len(lanes) == 1 and first.id == family:
            return first
        declared = next((p for p in self.declared if p.id == family), None)
        inputs = {b: (declared.inputs[b] if declared is not None and b in declared.inputs else i)
                  for b, i in first.inputs.items()}
        return replace(first, id=family, inputs=inputs, lane=None)

    def with_lake_partitions(self, partitions: Mapping[str, Sequence[str]]) -> Graph:
        """This graph over queues that gained partitions in the lake (``{queue: partitions}``,
        e.g. after ``Queue.add_partitions``): the new partitions of queues read by an
        every-partition binding get their lanes. The same graph when nothing was added."""
        changed = {}
        for name, parts in partitions.items():
            q = self.queues.get(name)
            if q is None:
                continue
            new = [p for p in parts if p not in q.partitions]
            if new:
                changed[name] = replace(q, partitions=(*q.partitions, *new))
        if not changed or not self.declared:
            return self
        return Graph.build(name=self.name, queues=[changed.get(q.name, q) for q in self.queues.values()],
                           processors=list(self.declared), error_queue=self.error_queue,
                           options=self.options)

    def error_queue_of(self, processor: Processor) -> str | None:
        return processor.error_queue or self.error_queue

    def producers_of(self, queue: str) -> list[str]:
        return [p.id for p in self.processors.values() if any(o.queue == queue for o in p.outputs.values())]

    def topological_order(self) -> list[str]:
        order, state = [], {}

        def visit(pid: str, path: list[str]) -> None:
            if state.get(pid) == 2:
                return
            if state.get(pid) == 1:
                cycle = " -> ".join([*path[path.index(pid):], pid])
                raise GraphError(f"graph {self.name!r} has a cycle: {cycle}", processor=pid)
            state[pid] = 1
            for binding in self.processors[pid].inputs.values():
                for upstream in self.producers_of(binding.queue):
                    visit(upstream, [*path, pid])
            state[pid] = 2
            order.append(pid)

        for pid in self.processors:
            visit(pid, [])
        return order

    def mermaid(self) -> str:
        """The topology as a Mermaid flowchart (queues as cylinders, processors as boxes)."""
        lines = ["flowchart LR"]
        for q in self.queues.values():
            lines.append(f"  q_{q.name}[({q.name})]")
        for family, lane_ids in self.families.items():
            p = self.processors[lane_ids[0]]
            lanes = f", {len(lane_ids)} partitions" if len(lane_ids) > 1 else ""
            lines.append(f"  p_{family}[{family}<br/><i>{p.kind.value}, {p.strategy.value}{lanes}</i>]")
            for binding, src in p.inputs.items():
                lines.append(f"  q_{src.queue} -->|{binding}| p_{family}")
            for binding, dst in p.outputs.items():
                lines.append(f"  p_{family} -->|{binding}| q_{dst.queue}")
            err = self.error_queue_of(p)
            if err:
                lines.append(f"  p_{family} -.->|errors| q_{err}")
        return "\n".join(lines)


_INPUTS = {Kind.SOURCE: (0, 0), Kind.MAP: (1, 1), Kind.JOIN: (2, None), Kind.ALTS: (2, None),
           Kind.FORK: (1, None), Kind.SINK: (1, None), Kind.IMPERATIVE: (0, None)}
_OUTPUTS = {Kind.SOURCE: (1, None), Kind.MAP: (1, 1), Kind.JOIN: (1, 1), Kind.ALTS: (1, 1),
            Kind.FORK: (2, None), Kind.SINK: (0, 0), Kind.IMPERATIVE: (0, None)}


def _count_ok(n: int, bounds: tuple[int, int | None]) -> bool:
    lo, hi = bounds
    return n >= lo and (hi is None or n <= hi)


def validate_graph(graph: Graph) -> None:
    validate_name(graph.name, kind="graph")
    writers: dict[tuple[str, str | None], str] = {}
    for q in graph.queues.values():
        validate_name(q.name)
        for part in q.partitions:
            validate_partition(part)
    for name in filter(None, [graph.error_queue]):
        if name not in graph.queues:
            raise GraphError(f"graph {graph.name!r}: error queue {name!r} is not a declared queue", queue=name)
    for p in graph.processors.values():
        validate_processor_id(p.id)
        where = f"processor {p.id!r} ({p.kind.value})"
        if any(i.partition == ALL_PARTITIONS for i in p.inputs.values()) or any(
                o.partition == SAME_PARTITION for o in p.outputs.values()):
            raise GraphError(f"{where}: its bindings are not resolved to partitions; make graphs with "
                             "Graph.build (it expands every-partition bindings into lanes)",
                             processor=p.id)
        if not _count_ok(len(p.inputs), _INPUTS[p.kind]):
            raise GraphError(f"{where}: has {len(p.inputs)} input binding(s); a {p.kind.value} takes "
                             f"{_bounds_text(_INPUTS[p.kind])}", processor=p.id)
        if not _count_ok(len(p.outputs), _OUTPUTS[p.kind]):
            raise GraphError(f"{where}: has {len(p.outputs)} output binding(s); a {p.kind.value} takes "
                             f"{_bounds_text(_OUTPUTS[p.kind])}", processor=p.id)
        for binding, src in [*p.inputs.items(), *p.outputs.items()]:
            if src.queue not in graph.queues:
                raise GraphError(f"{where}: binding {binding!r} names unknown queue {src.queue!r}; "
                                 f"declare it in the graph's queues", processor=p.id, binding=binding)
        for binding, src in p.inputs.items():
            if src.partition not in graph.queues[src.queue].partitions:
                raise GraphError(f"{where}: input {binding!r} reads partition {src.partition!r}, which "
                                 f"queue {src.queue!r} does not declare", processor=p.id, binding=binding)
        for binding, dst in p.outputs.items():
            qdef = graph.queues[dst.queue]
            if dst.partition_column is None and dst.partition not in qdef.partitions:
                raise GraphError(f"{where}: output {binding!r} writes partition {dst.partition!r}, which "
                                 f"queue {dst.queue!r} does not declare", processor=p.id, binding=binding)
            if dst.partition_column is not None and dst.partition_column not in qdef.schema.names:
                raise GraphError(f"{where}: output {binding!r} routes by column {dst.partition_column!r}, "
                                 f"which queue {dst.queue!r} does not have", processor=p.id, binding=binding)
            key = (dst.queue, None if dst.partition_column else dst.partition)
            _check_distinct_outputs(p, binding, dst, where)
            other = writers.get(key) or writers.get((dst.queue, None))
            if other and other != (p.family or p.id):  # a processor's lanes are one writer
                raise GraphError(f"{where}: output {binding!r} writes {dst.queue!r}, which processor "
                                 f"{other!r} already writes; give each output queue one writer",
                                 processor=p.id, binding=binding)
            writers[key] = p.family or p.id
        _check_signature(p, where)
        err = graph.error_queue_of(p)
        if err and err not in graph.queues:
            raise GraphError(f"{where}: error queue {err!r} is not a declared queue", processor=p.id)
        if p.options.batch_size < 1:
            raise GraphError(f"{where}: batch_size must be >= 1", processor=p.id)
        if p.options.max_batch_size < p.options.batch_size:
            raise GraphError(f"{where}: max_batch_size ({p.options.max_batch_size:,}) must be >= "
                             f"batch_size ({p.options.batch_size:,}); set it to batch_size for "
                             "fixed-size steps", processor=p.id)
        if p.options.lane_workers < 1:
            raise GraphError(f"{where}: lane_workers must be >= 1 (1: lanes step in turn)", processor=p.id)
        if p.options.backing_maintenance_every < 0:
            raise GraphError(f"{where}: backing_maintenance_every must be >= 0 (0: never)",
                             processor=p.id)
    graph.topological_order()


def _bounds_text(bounds: tuple[int, int | None]) -> str:
    lo, hi = bounds
    if hi is None:
        return f"at least {lo}"
    return f"exactly {lo}" if lo == hi else f"{lo} to {hi}"


def _check_distinct_outputs(p: Processor, binding: str, dst: Out, where: str) -> None:
    """Two output bindings of one processor may not write the same queue partition (one would
    silently replace the other's rows): the same fixed partition, or a routed one on either side."""
    for other, o in p.outputs.items():
        if other == binding:
            break
        if o.queue != dst.queue:
            continue
        if o.partition_column is None and dst.partition_column is None and o.partition != dst.partition:
            continue
        what = (f"partition {dst.partition!r}" if o.partition_column is None and dst.partition_column is None
                else "partitions chosen by a partition_column")
        raise GraphError(f"{where}: outputs {other!r} and {binding!r} both write {what} of queue "
                         f"{dst.queue!r}; merge them into one output (union the frames) or write "
                         f"different partitions", processor=p.id, binding=binding, other=other)


def _check_signature(p: Processor, where: str) -> None:
    """The function is called ``fn(ctx, **{binding: frame})``: its first positional parameter
    takes the context and every input binding must be a parameter name (or land in ``**kwargs``),
    with no other required parameter."""
    try:
        sig = inspect.signature(p.fn)
    except (TypeError, ValueError):
        return  # a builtin or C callable without a signature: nothing to check
    bindings = sorted(p.inputs)
    try:
        sig.bind(object(), **dict.fromkeys(bindings, object()))
    except TypeError as exc:
        params = [str(x) for x in sig.parameters.values()]
        raise GraphError(
            f"{where}: its function {getattr(p.fn, '__qualname__', p.fn)!r}({', '.join(params)}) does not "
            f"fit its input bindings {bindings}: it is called as fn(ctx, "
            f"{', '.join(f'{b}=<frame>' for b in bindings)}) ({exc}); name the parameters after the "
            "bindings (the first one takes the context) or add **frames", processor=p.id) from exc

