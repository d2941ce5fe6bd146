"""A reconstructable job of the test graph, for ``execute_job`` re-execution tests.

The lake root comes from ``$CUES_LAKE`` at run time (``LakeResource()``'s default), and steps run
in-process (``in_process_executor``) so they share the test session's Spark.
"""

from __future__ import annotations

from dagster import Definitions, in_process_executor

from cues_platform.dagster import all_job_name, build_definitions
from tests.dagster.graphs import build_graph

GRAPH = build_graph()
defs = Definitions.merge(build_definitions(GRAPH, schedule_cron=None), Definitions(executor=in_process_executor))


def all_job():
    return defs.resolve_job_def(all_job_name(GRAPH))
