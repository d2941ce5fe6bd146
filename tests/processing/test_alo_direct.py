"""at_least_once commits its outputs directly (issue 11, item 4): no staged file, no re-read; the
positions are committed after the outputs, so a crash in between re-runs the step (its outputs
twice, same step and delivery hash, nothing lost) over the plan saved before it ran."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cues_platform.processing import GraphRunner, SimulatedCrash, Strategy
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from cues_platform.queues.positions import PositionStore
from tests.processing.graphs import PID, CrashAt, build_graph, load_inputs
from tests.support import ROOT, rows

ALO = Strategy.AT_LEAST_ONCE

CHILD = """
import sys
from cues_platform.processing import GraphRunner, Strategy
from cues_platform.queues import Lake
from tests.processing.graphs import CrashAt, build_graph
root = sys.argv[1]
graph = build_graph("map", strategy=Strategy.AT_LEAST_ONCE)
GraphRunner(graph=graph, lake=Lake(root=root), hook=CrashAt("after_commit", 2, "kill")).run_until_idle()
print("NOT KILLED")
"""


def hashes_by_id(lake: Lake, queue: str) -> dict[int, list[str]]:
    t = lake.queue(queue).read_arrow(partition="0")
    out: dict[int, list[str]] = {}
    for i, h in zip(t["id"].to_pylist(), t["_delivery_hash"].to_pylist(), strict=True):
        out.setdefault(i, []).append(h)
    return out


def staging_files(lake: Lake) -> list[Path]:
    root = lake.local_path(lake.system_uri("staging", PID))
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_sigkill_between_the_output_commit_and_the_positions_reruns_the_step(spark, tmp_path):
    """A real process is SIGKILLed after step 1's output commit, before its position commit: the
    output is there, the positions are not. The restart re-runs step 1 over the same range with the
    same delivery hash: ids 10..19 twice, every other id once, nothing lost."""
    root = tmp_path / "lake"
    lake = Lake(root=str(root))
    graph = build_graph("map", strategy=ALO)
    create_queues(graph, lake)
    load_inputs(lake, "map")
    log = tmp_path / "child.log"
    with log.open("w") as out:
        proc = subprocess.run([sys.executable, "-c", CHILD, str(root)], cwd=ROOT, stdout=out,
                              stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              timeout=600, check=False)
    text = log.read_text()
    assert proc.returncode == -signal.SIGKILL, f"child exited {proc.returncode}:\n{text[-3000:]}"
    assert "NOT KILLED" not in text
    first = hashes_by_id(lake, "b")
    assert sorted(first) == [i * 2 for i in range(20)]  # steps 0 and 1 committed their outputs
    assert PositionStore(lake).get(queue="a", tailer=PID, partition="0") == 10  # step 1's: not
    assert staging_files(lake) == []

    stats = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    rerun = stats[PID].results[0]
    assert (rerun.step, rerun.inputs["src"].start, rerun.inputs["src"].end) == (1, 10, 20)
    after = hashes_by_id(lake, "b")
    assert Counter({i: len(h) for i, h in after.items()}) == Counter(
        {i * 2: 2 if 10 <= i < 20 else 1 for i in range(30)})
    for i in range(10, 20):  # both copies carry the first run's delivery hash
        assert after[i * 2] == first[i * 2] * 2 and rerun.delivery_hash == first[i * 2][0]
    assert PositionStore(lake).get(queue="a", tailer=PID, partition="0") == 30


def test_a_map_rerun_honours_the_saved_plan_when_more_rows_arrived(spark, lake):
    """Step 1 reads the 5 rows there are (batch 10), commits its output and crashes before its
    positions; 10 rows arrive. The re-run is step 1 over exactly 10..15 again (same hash: its
    duplicates are recognisable downstream), then step 2 takes 15..25."""
    graph = build_graph("map", strategy=ALO)
    create_queues(graph, lake)
    lake.queue("a").append(rows(0, 15), partition="0")
    with pytest.raises(SimulatedCrash):
        GraphRunner(graph=graph, lake=lake, spark=spark, hook=CrashAt("after_commit", 2)).run_until_idle()
    first = hashes_by_id(lake, "b")
    lake.queue("a").append(rows(15, 10), partition="0")
    stats = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    steps = [(r.step, r.inputs["src"].start, r.inputs["src"].end) for r in stats[PID].results]
    assert steps == [(1, 10, 15), (2, 15, 25)]
    after = hashes_by_id(lake, "b")
    assert {i: len(h) for i, h in after.items()} == {i * 2: 2 if 10 <= i < 15 else 1 for i in range(25)}
    assert all(after[i * 2] == first[i * 2] * 2 for i in range(10, 15))


def test_outputs_are_committed_from_memory_without_staged_files(spark, lake):
    """A fork crashes between its two queues' commits (b committed, d not): nothing was staged
    (the old path left a staged Parquet file per queue here, and read it back to commit), b's rows
    of step 1 came in one commit, and the restart re-runs the step: b twice, d once, none lost."""
    graph = build_graph("fork", strategy=ALO)
    create_queues(graph, lake)
    load_inputs(lake, "fork")
    created = lake.queue("b").version()
    with pytest.raises(SimulatedCrash):
        GraphRunner(graph=graph, lake=lake, spark=spark, hook=CrashAt("between_commits", 3)).run_until_idle()
    assert staging_files(lake) == []
    assert not lake.local_path(lake.system_uri("staging")).exists()
    assert lake.queue("b").version() == created + 2 and sorted(hashes_by_id(lake, "b")) == [i * 2 for i in range(20)]
    assert sorted(hashes_by_id(lake, "d")) == [i * 3 for i in range(10)]
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert {i: len(h) for i, h in hashes_by_id(lake, "b").items()} == {
        i * 2: 2 if 10 <= i < 20 else 1 for i in range(30)}
    assert {i: len(h) for i, h in hashes_by_id(lake, "d").items()} == {i * 3: 1 for i in range(30)}
    assert staging_files(lake) == []
