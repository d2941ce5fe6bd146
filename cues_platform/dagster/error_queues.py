"""Error queues in the asset graph: every contract break and processor error lands there, so the
operator sees them as assets with an edge from each processor that writes them.

An error queue is not a processor output (no op materializes it): it is an ``AssetSpec`` whose
deps are the asset keys of the processors that write it. Each processor materialization logs an
``AssetObservation`` on it with the queue's rows by processor and reason (the error rows'
``exception_type``, e.g. ``cues_platform.ContractViolation`` or the user's own exception), read
from the queue itself, so the counts are the lake's, not the run's memory.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from dagster import AssetDep, AssetKey, AssetObservation, AssetSpec

from cues_platform.processing.graph import Graph
from cues_platform.queues import Lake


def error_queue_writers(graph: Graph) -> dict[str, list[str]]:
    """``{error queue: [processor ids that write it]}`` in topological order."""
    out: dict[str, list[str]] = {}
    for pid in graph.family_order():
        err = graph.error_queue_of(graph.as_declared(pid))
        if err:
            out.setdefault(err, []).append(pid)
    return out


def error_queue_spec(graph: Graph, name: str, writer_keys: Sequence[AssetKey], *,
                     key: AssetKey, group_name: str | None) -> AssetSpec:
    deps: list[AssetDep] = []
    for k in writer_keys:
        if all(d.asset_key != k for d in deps):
            deps.append(AssetDep(k))
    return AssetSpec(
        key, deps=deps, group_name=group_name, kinds={"delta"},
        tags={"cues/role": "error_queue"},
        description=(f"Error queue {name!r} of graph {graph.name!r}: one row per failed step "
                     "(the processor's own exception) and per row that broke an output "
                     "queue's contract, with its payload. Its observations count the rows by "
                     "processor and reason."),
        metadata={"cues/queue": name},
    )


def error_counts(lake: Lake, name: str) -> dict[str, dict[str, int]]:
    """``{processor: {exception_type: rows}}`` of the error queue ``name``."""
    queue = lake.queue(name)
    counts: Counter[tuple[str, str]] = Counter()
    for part in queue.partitions:
        table = queue.read_arrow(partition=part, columns=["processor", "exception_type"])
        counts.update(zip(table["processor"].to_pylist(), table["exception_type"].to_pylist(),
                          strict=True))
    out: dict[str, dict[str, int]] = {}
    for (proc, reason), n in sorted(counts.items()):
        out.setdefault(proc, {})[reason] = n
    return out


def observe_error_queue(lake: Lake, name: str, *, key: AssetKey, processor: str,
                        rows_from_run: int) -> AssetObservation:
    by = error_counts(lake, name)
    total = sum(sum(r.values()) for r in by.values())
    metadata: dict[str, Any] = {
        "cues/queue": name, "dagster/row_count": total, "cues/by_processor": by,
        "cues/observed_by": processor, "cues/rows_from_this_run": rows_from_run,
    }
    return AssetObservation(asset_key=key, metadata=metadata)
