"""Graphs: processors and the queues between them, validated when built.

The top of the graph's floors: ``model.py`` (the vocabulary: :class:`Processor`, :class:`QueueDef`,
:class:`In`, :class:`Out`, :class:`Options` and the kinds and strategies), ``lanes.py`` (a
processor over every partition expanded into lanes), ``validation.py`` (the rules, checked on
construction) and ``mermaid.py`` (the picture) are below it; :class:`Graph` puts them together.
The vocabulary is re-exported here, so ``from cues_platform.processing.graph import Processor``
keeps working; modules of this package import it from ``model.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from cues_platform.processing.errors import GraphError
from cues_platform.processing.lanes import expand
from cues_platform.processing.mermaid import mermaid
from cues_platform.processing.model import (
    ALL_PARTITIONS,
    SAME_PARTITION,
    AssetBody,
    GraphShape,
    In,
    Kind,
    Options,
    Out,
    OutputWriter,
    Processor,
    QueueDef,
    ReadAs,
    SnapshotAt,
    Strategy,
)
from cues_platform.processing.validation import validate_graph
from cues_platform.queues.names import validate_name

__all__ = [
    "ALL_PARTITIONS", "SAME_PARTITION", "AssetBody", "Graph", "GraphShape", "In", "Kind", "Options",
    "Out", "OutputWriter", "Processor", "QueueDef", "ReadAs", "SnapshotAt", "Strategy",
    "validate_graph",
]


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
        return mermaid(self)
