"""The processing layer's app-transaction ids against the registry (queues/layout.py).

An exactly-once map and a sink run on a real lake and Spark; every app transaction then found in
any Delta log of the lake (queues, backing queues, the sink's table) must match a registry entry
of a table of that kind, carry ``lastUpdated`` exactly when the entry may expire, and every entry
the processing layer owns (except the legacy position it only reads) must have been written.
tests/queues/test_layout.py does the same for the queue layer.
"""

from __future__ import annotations

from pathlib import Path

from cues_platform.processing.runner import GraphRunner
from cues_platform.queues import Lake
from cues_platform.queues.layout import (
    APP_IDS,
    BACKING,
    HOME,
    LEGACY_LANE_POSITION,
    QUEUE,
    SINK_TABLE,
    AppId,
)
from tests.processing.graphs import build_graph, load_inputs, sink_uri
from tests.queues.test_layout import logged_app_transactions


def entry_for(app_id: str, kinds: tuple[str, ...]) -> AppId:
    matching = [a for a in APP_IDS if a.table in kinds and app_id.startswith(a.prefix)
                and (len(app_id) > len(a.prefix) or not a.key)]
    assert matching, f"{app_id!r} in a {kinds} table is in no registry entry"
    return max(matching, key=lambda a: len(a.prefix))


def test_every_app_id_the_processing_layer_writes_is_registered(spark, tmp_path: Path) -> None:
    seen: set[str] = set()
    for kind in ("map", "sink"):
        lake = Lake(root=str(tmp_path / kind))
        graph = build_graph(kind)
        runner = GraphRunner(graph=graph, lake=lake, spark=spark)
        load_inputs(lake, kind)
        runner.run_until_idle()
        tables: list[tuple[Path, tuple[str, ...]]] = [
            (p, (QUEUE, HOME)) for p in Path(lake.root, "queues").iterdir()]
        tables += [(p, (QUEUE, BACKING)) for p in Path(lake.system_uri("backing")).iterdir()]
        if kind == "sink":
            tables.append((Path(sink_uri(lake)), (SINK_TABLE,)))
        for path, kinds in tables:
            for txn in logged_app_transactions(path):
                entry = entry_for(txn["appId"], kinds)
                seen.add(f"{entry.prefix}{entry.key}@{entry.table}")
                assert ("lastUpdated" in txn) == entry.expiring, (path, txn, entry)
    processing = {f"{a.prefix}{a.key}@{a.table}" for a in APP_IDS
                  if a.owner.startswith("processing/") and a is not LEGACY_LANE_POSITION}
    assert processing <= seen, f"not written by the workload: {sorted(processing - seen)}"
