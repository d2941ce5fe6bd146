"""One processor over every partition of a queue: lanes.

``In("postings")`` binds every partition of ``postings`` (``In("postings", "bank-a")`` one).
:meth:`Graph.build <cues_platform.processing.graph.Graph.build>` expands a processor with such a
binding into one *lane* per partition, and every lane is a processor of its own: its own backing
queue, snapshots, attempts, positions (the app transactions ``proc:{lane}``) and delivery hashes.
So exactly-once holds per partition by the same protocol, the same crash points and the same
audit as for a processor over one partition; nothing in the step protocol knows about lanes.

Contract of :func:`expand`:

1. Bindings of every partition (``ALL_PARTITIONS``) are co-partitioned: the queues they read
   declare the same partitions (a join of ``a`` and ``b`` binds partition p of each, as Kafka
   Streams requires); otherwise :class:`GraphError` names both queues and their partitions.
2. One lane per partition p, in the first such queue's order. The lane of partition ``"0"`` keeps
   the processor's id, so a lake written before lanes existed (every binding read partition
   ``"0"``) is continued where it stopped; the lane of p is ``{id}.{p}`` (a processor id never
   contains '.', so no lane takes another processor's id).
3. A lane reads partition p of each every-partition binding, and the named partition of every
   other binding (each lane with its own position there: a broadcast side such as rates).
4. Outputs: ``Out(queue)`` (``SAME_PARTITION``, the default) writes partition p of ``queue``,
   which must declare it; ``Out(queue, "x")`` writes the one named partition (all lanes: one
   writer family); ``Out(queue, partition_column=c)`` routes each row by ``c``.
5. A processor without every-partition bindings is one lane of itself, its ``SAME_PARTITION``
   outputs writing partition ``"0"`` (what ``Out(queue)`` always meant).

6. Positions belong to the lane that read them (``pos:{lane}:{queue}/{partition}``): a lane that
   would read a queue partition another processor of its family read and no longer reads (every
   partition <-> a named partition, in either direction) is refused before any step by
   :mod:`cues_platform.processing.deployments` (:class:`LaneMigrationError`): it would start at
   offset 0 and deliver that input again.

Partitions added to a queue later (:meth:`Queue.add_partitions`) get their lanes when the graph is
re-expanded over the lake's partitions (:meth:`Graph.with_lake_partitions`), which the runner does
at start and then every ``LANE_REFRESH_SECONDS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from cues_platform.processing.errors import GraphError
from cues_platform.processing.model import (  # the partition markers are defined with In and Out
    ALL_PARTITIONS,
    DEFAULT_PARTITION,
    SAME_PARTITION,
    Processor,
    QueueDef,
)

__all__ = ["ALL_PARTITIONS", "DEFAULT_PARTITION", "LANE_REFRESH_SECONDS", "SAME_PARTITION", "expand",
           "family_of", "lane_id", "lane_partitions"]

LANE_REFRESH_SECONDS = 5.0


def lane_id(processor: str, partition: str) -> str:
    """Step 2: the id of the lane of ``partition`` of ``processor``."""
    return processor if partition == DEFAULT_PARTITION else f"{processor}.{partition}"


def family_of(processor_id: str) -> str:
    """The id the user gave the processor whose lane ``processor_id`` is."""
    return processor_id.partition(".")[0]


def lane_partitions(p: Processor, queues: Mapping[str, QueueDef]) -> tuple[str, ...] | None:
    """Step 1: the partitions of ``p``'s every-partition bindings, or None if it has none."""
    found: tuple[str, str, tuple[str, ...]] | None = None
    for binding, src in p.inputs.items():
        if src.partition != ALL_PARTITIONS:
            continue
        if src.queue not in queues:
            raise GraphError(f"processor {p.id!r} ({p.kind.value}): binding {binding!r} names unknown "
                             f"queue {src.queue!r}; declare it in the graph's queues",
                             processor=p.id, binding=binding)
        parts = tuple(queues[src.queue].partitions)
        if found is None:
            found = (binding, src.queue, parts)
        elif set(parts) != set(found[2]):
            raise GraphError(
                f"processor {p.id!r} ({p.kind.value}): inputs {found[0]!r} (queue {found[1]!r}, "
                f"partitions {list(found[2])}) and {binding!r} (queue {src.queue!r}, partitions "
                f"{list(parts)}) are not co-partitioned: a processor over every partition binds "
                "partition p of each; give the queues the same partitions, or bind one input to a "
                f"named partition (In({src.queue!r}, 'p'))", processor=p.id, binding=binding)
    return None if found is None else found[2]


def expand(p: Processor, queues: Mapping[str, QueueDef]) -> list[Processor]:
    """Steps 1-5: the lanes of ``p`` (``[p]`` itself, outputs resolved, when it has no
    every-partition binding)."""
    parts = lane_partitions(p, queues)
    if parts is None:  # Step 5
        outputs = {b: (replace(o, partition=DEFAULT_PARTITION) if o.partition == SAME_PARTITION else o)
                   for b, o in p.outputs.items()}
        return [replace(p, outputs=outputs, family=p.family or p.id)]
    lanes = []
    for part in parts:  # Step 2
        inputs = {b: (replace(i, partition=part) if i.partition == ALL_PARTITIONS else i)  # Step 3
                  for b, i in p.inputs.items()}
        outputs = {}
        for b, o in p.outputs.items():  # Step 4
            if o.partition == SAME_PARTITION and o.partition_column is not None:
                o = replace(o, partition=DEFAULT_PARTITION)  # routed by the column
            elif o.partition == SAME_PARTITION:
                qdef = queues.get(o.queue)
                if qdef is not None and part not in qdef.partitions:
                    raise GraphError(
                        f"processor {p.id!r} ({p.kind.value}): output {b!r} writes the partition of "
                        f"each lane to queue {o.queue!r}, which does not declare partition {part!r} "
                        f"(it has {list(qdef.partitions)}); declare the same partitions as its input, "
                        f"or write one named partition: Out({o.queue!r}, '0')",
                        processor=p.id, binding=b)
                o = replace(o, partition=part)  # partition_column is None here
            outputs[b] = o
        lanes.append(replace(p, id=lane_id(p.id, part), inputs=inputs, outputs=outputs,
                             family=p.id, lane=part))
    return lanes
