"""A graph drawn as a Mermaid flowchart (``Graph.mermaid()``, ``cues graph show``): queues as
cylinders, processors (lanes folded into the processor as declared) as boxes."""

from __future__ import annotations

from cues_platform.processing.model import GraphShape


def mermaid(graph: GraphShape) -> str:
    """The topology as a Mermaid flowchart (queues as cylinders, processors as boxes)."""
    lines = ["flowchart LR"]
    for q in graph.queues.values():
        lines.append(f"  q_{q.name}[({q.name})]")
    for family, lane_ids in graph.families.items():
        p = graph.processors[lane_ids[0]]
        lanes = f", {len(lane_ids)} partitions" if len(lane_ids) > 1 else ""
        lines.append(f"  p_{family}[{family}<br/><i>{p.kind.value}, {p.strategy.value}{lanes}</i>]")
        for binding, src in p.inputs.items():
            lines.append(f"  q_{src.queue} -->|{binding}| p_{family}")
        for binding, dst in p.outputs.items():
            lines.append(f"  p_{family} -->|{binding}| q_{dst.queue}")
        err = graph.error_queue_of(p)
        if err:
            lines.append(f"  p_{family} -.->|errors| q_{err}")
    return "\n".join(lines)
