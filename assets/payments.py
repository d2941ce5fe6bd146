"""The payments graph as Dagster assets: one asset per processor output queue (a multi-asset for
the ``validate`` fork), the external ``postings`` queue, blocking contract / exactly-once checks,
the new-data and sink sensors (on the lag: a drained lake launches no run), the on-demand sensor
of ``fx`` (runs it when ``convert`` waits for a fixing, not every 15 minutes), the recovery
sensor, one job per processor (``payments__<processor>``: what the sensors' runs are named), the
job ``payments__all`` and its schedule (a skip on a drained lake)."""

from __future__ import annotations

from dagster import AssetKey

from cues_platform.dagster import build_definitions
from cues_platform.reference.pipeline import payments_graph
from resources import lake, ledger, spark

graph = payments_graph()

# lineage: the simulated participants (assets/traffic.py) write the external queue `postings`
defs = build_definitions(graph, lake=lake, spark=spark, resources={"ledger": ledger}, group_name="payments",
                         producers={"postings": [AssetKey("participant_traffic")]})
