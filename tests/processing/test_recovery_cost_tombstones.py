"""Recovery after ``cues queue maintain`` compacted a processor's home queue: the home's newest
checkpoint holds none of the compacted step files' tombstones (every open of the home, recovery
included, read one per step file for the 24 h tombstone retention), and nothing else changes:
the output is exact, the audit passes over the checkpoint's empty commit, a new runner recovers
without stepping again, and a reader of the home before the compaction keeps its files through
vacuum (``maintenance.checkpoint_without_tombstones``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from deltalake import DeltaTable

from cues_platform.audit import audit
from cues_platform.processing import GraphRunner
from cues_platform.processing.home import home_of
from cues_platform.queues import Lake, maintenance
from tests.processing.graphs import PID, build_graph, check_exact, load_inputs

N, BATCH = 30, 5  # 6 one-commit steps, 6 step files in the home


def _newest_checkpoint_tombstones(queue) -> int:
    log = Path(queue.uri.removeprefix("file://")) / "_delta_log"
    newest = max(log.glob("*.checkpoint.parquet"))
    return sum(1 for r in pq.read_table(newest, columns=["remove"]).column("remove").to_pylist() if r)


def test_recovery_after_maintaining_the_home_reads_no_tombstone_and_changes_nothing(spark, lake):
    graph = build_graph("map", "output", batch=BATCH)
    home_name = home_of(graph.processors[PID])
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)  # creates the queues
    load_inputs(lake, "map", n=N)
    assert runner.run_until_idle()[PID].steps == N // BATCH
    home = lake.queue(home_name)
    reader = DeltaTable(home.uri, version=home.refresh().version())
    step_files = len(reader.file_uris())
    assert step_files == N // BATCH

    compaction, checkpointed, vacuumed = maintenance.maintain(Lake(root=lake.root).queue(home_name))

    assert compaction.files_removed == step_files and vacuumed.files_vacuumed == 0
    assert checkpointed.checkpoint_version == lake.queue(home_name).version()
    assert _newest_checkpoint_tombstones(home) == 0
    # the reader of the snapshot before the compaction keeps every file through vacuum
    assert len(reader.to_pyarrow_table()) == N
    check_exact(lake, "map", "output", n=N, batch=BATCH)
    assert audit(lake, graph=graph).ok, audit(lake, graph=graph).to_text()
    again = GraphRunner(graph=graph, lake=Lake(root=lake.root), spark=spark)
    assert again.run_until_idle()[PID].steps == 0
    assert again.steppers[PID].positions == {"src": N}
    assert again.steppers[PID].next_step == N // BATCH
