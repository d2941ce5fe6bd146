"""The payments graph as Dagster assets: one asset per processor output queue (a multi-asset for
the ``validate`` fork), the external ``postings`` queue, blocking contract / exactly-once checks,
new-data, sink and recovery sensors, the job ``payments__all`` and its schedule."""

from __future__ import annotations

from dagster import AssetKey

from cues_platform.dagster import build_definitions
from cues_platform.reference.pipeline import payments_graph
from resources import lake, ledger, spark

graph = payments_graph()

# lineage: the simulated participants (assets/traffic.py) write the external queue `postings`
defs = build_definitions(graph, lake=lake, spark=spark, resources={"ledger": ledger}, group_name="payments",
                         producers={"postings": [AssetKey("participant_traffic")]})
