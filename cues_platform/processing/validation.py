"""A graph's rules, checked when it is built (``Graph.__post_init__``): names, binding counts per
kind, bindings resolved to declared queue partitions, one writer per output queue partition, the
function's signature against its input bindings, options in range, no cycle.

Reads the graph through :class:`~cues_platform.processing.model.GraphShape`; every breach is a
:class:`~cues_platform.processing.errors.GraphError` naming the processor and binding at fault.
"""

from __future__ import annotations

import inspect

from cues_platform.processing.errors import GraphError
from cues_platform.processing.model import (
    ALL_PARTITIONS,
    SAME_PARTITION,
    GraphShape,
    Kind,
    Out,
    Processor,
    ReadAs,
)
from cues_platform.queues.names import validate_name, validate_partition, validate_processor_id

_INPUTS = {Kind.SOURCE: (0, 0), Kind.MAP: (1, 1), Kind.JOIN: (2, None), Kind.ALTS: (2, None),
           Kind.FORK: (1, None), Kind.SINK: (1, None), Kind.IMPERATIVE: (0, None)}
_OUTPUTS = {Kind.SOURCE: (1, None), Kind.MAP: (1, 1), Kind.JOIN: (1, 1), Kind.ALTS: (1, 1),
            Kind.FORK: (2, None), Kind.SINK: (0, 0), Kind.IMPERATIVE: (0, None)}


def _count_ok(n: int, bounds: tuple[int, int | None]) -> bool:
    lo, hi = bounds
    return n >= lo and (hi is None or n <= hi)


def validate_graph(graph: GraphShape) -> None:
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
        if p.options.max_isolation_calls is not None and p.options.max_isolation_calls < 0:
            raise GraphError(f"{where}: max_isolation_calls must be >= 0 (0: a failing step's rows "
                             "each get an error row without splitting)", processor=p.id)
        if p.options.isolation_workers < 1:
            raise GraphError(f"{where}: isolation_workers must be >= 1 (1: isolation's calls one at "
                             "a time)", processor=p.id)
        if not isinstance(p.options.read_as, ReadAs):
            raise GraphError(f"{where}: read_as must be a ReadAs ({', '.join(r.value for r in ReadAs)}), "
                             f"not {p.options.read_as!r}; e.g. Options(read_as=ReadAs.ARROW)",
                             processor=p.id)
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

