"""The test graph's definitions for the daemon test (``test_daemon.py``): automation as
``build_definitions`` makes it by default (every sensor RUNNING), ticking every second, runs in
process. The lake is ``$CUES_LAKE`` (``LakeResource()``'s default), set by the test."""

from __future__ import annotations

from dagster import Definitions, in_process_executor

from cues_platform.dagster import build_definitions
from tests.dagster.graphs import build_graph

defs = Definitions.merge(build_definitions(build_graph(), schedule_cron=None, sensor_interval_seconds=1),
                         Definitions(executor=in_process_executor))
