"""Finding processors' backing queues under a lake (``processing/discovery.py``): what the
deployments check and retention read, and what the auditor reads through ``audit/discovery.py``."""

from __future__ import annotations

from pathlib import Path

from cues_platform.audit import discovery as audit_discovery
from cues_platform.processing import discovery
from cues_platform.processing.backing import BackingQueue
from cues_platform.queues import Lake


def test_backing_processors_are_the_backing_folders_that_are_delta_tables(lake: Lake) -> None:
    BackingQueue(lake, "enrich")
    BackingQueue(lake, "enrich.bank-a")  # a lane
    stray = Path(lake.local_path(lake.system_uri("backing", "stray")))
    stray.mkdir(parents=True)  # a folder that is no table (a half-created or emptied backing queue)
    assert discovery.backing_folders(lake) == ["enrich", "enrich.bank-a", "stray"]
    assert discovery.backing_processors(lake) == ["enrich", "enrich.bank-a"]
    # the auditor sees the same lake through processing's discovery
    assert audit_discovery.backing_folders(lake) == discovery.backing_folders(lake)
    assert audit_discovery.backing_processors(lake) == discovery.backing_processors(lake)
    assert audit_discovery.open_backing(lake, "enrich").uri == discovery.backing_uri(lake, "enrich")


def test_a_lake_without_backing_queues_lists_none(lake: Lake) -> None:
    assert discovery.backing_folders(lake) == []
    assert discovery.backing_processors(lake) == []
