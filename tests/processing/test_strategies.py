"""at_least_once and at_most_once: what a crash at each point does (documented in
docs/guarantees.md). A map over 30 rows in 3 steps of 10; the crash hits step 1 (ids 10..19)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from cues_platform.processing import GraphRunner, SimulatedCrash, Strategy
from cues_platform.queues.positions import PositionStore
from tests.processing.graphs import PID, CrashAt, build_graph, ids_of, load_inputs, sink_rows
from tests.support import rows

ALO, AMO = Strategy.AT_LEAST_ONCE, Strategy.AT_MOST_ONCE
ALL = list(range(30))
BLOCK1 = list(range(10, 20))

# point -> (at_least_once result, at_most_once result) for the crashed step 1 of a map
MAP_CASES = {
    "before_snapshot": ("once", "once"),
    "after_snapshot": ("once", "lost"),   # at_most_once saved its positions before this point
    "after_read": ("once", "lost"),
    "after_function": ("once", "lost"),
    "after_prepare": ("once", "lost"),
    "after_commit": ("duplicated", "once"),  # at_least_once saves its positions after this point
}


def expected_ids(result: str, scale: int = 2) -> Counter:
    ids = Counter(i * scale for i in ALL)
    if result == "duplicated":
        ids.update(i * scale for i in BLOCK1)
    elif result == "lost":
        ids.subtract(i * scale for i in BLOCK1)
    return +ids


def run_with_crash(spark, lake, graph, kind: str, hook: CrashAt | None) -> None:
    runner = GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook)
    load_inputs(lake, kind)
    if hook is None:
        runner.run_until_idle()
        return
    with pytest.raises(SimulatedCrash):
        runner.run_until_idle()
    assert hook.fired
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()


def bag(lake, queue: str) -> Counter:
    return Counter(ids_of(lake, queue))


@pytest.mark.parametrize("point", list(MAP_CASES))
@pytest.mark.parametrize("strategy", [ALO, AMO])
def test_map_crash_point(spark, lake, strategy, point):
    graph = build_graph("map", strategy=strategy)
    run_with_crash(spark, lake, graph, "map", CrashAt(point, 2))
    result = MAP_CASES[point][0 if strategy is ALO else 1]
    assert bag(lake, "b") == expected_ids(result)
    # Both strategies finish with their positions at the end of the input.
    assert PositionStore(lake).get(queue="a", tailer=PID, partition="0") == 30


@pytest.mark.parametrize(("strategy", "b_result", "d_result"), [
    (ALO, "duplicated", "once"),  # b was committed, the positions were not: the step runs again
    (AMO, "once", "lost"),        # positions saved first: d never gets step 1
])
def test_fork_crash_between_commits(spark, lake, strategy, b_result, d_result):
    graph = build_graph("fork", strategy=strategy)
    # The position strategies pass "between_commits" after each queue's commit: step 0 passes it
    # twice, so the 3rd time is step 1 after b's commit and before d's.
    run_with_crash(spark, lake, graph, "fork", CrashAt("between_commits", 3))
    assert bag(lake, "b") == expected_ids(b_result, 2)
    assert bag(lake, "d") == expected_ids(d_result, 3)


def test_at_least_once_error_rows_repeat_with_the_step(spark, lake):
    """A handled error is an output like any other: re-running the step writes it again."""
    graph = build_graph("map", "error", strategy=ALO)
    run_with_crash(spark, lake, graph, "map", CrashAt("after_commit", 1 + 1))
    errors = lake.queue("errors").read_arrow(partition="0").to_pylist()
    # one error row per row of block 1 (isolation), the whole set written twice
    assert {e["processor"] for e in errors} == {PID}
    assert Counter(json.loads(e["inputs"])["src"][2] for e in errors) == Counter(
        {o: 2 for o in range(10, 20)})
    assert bag(lake, "b") == Counter(i * 2 for i in ALL if i not in BLOCK1)


def test_at_most_once_error_rows_lost_with_the_step(spark, lake):
    graph = build_graph("map", "error", strategy=AMO)
    run_with_crash(spark, lake, graph, "map", CrashAt("after_snapshot", 2))
    assert lake.queue("errors").read_arrow(partition="0").num_rows == 0
    assert bag(lake, "b") == Counter(i * 2 for i in ALL if i not in BLOCK1)


@pytest.mark.parametrize("kind", ["map", "join", "fork"])
@pytest.mark.parametrize("strategy", [ALO, AMO])
def test_without_crashes_exactly_once(spark, lake, strategy, kind):
    graph = build_graph(kind, strategy=strategy)
    run_with_crash(spark, lake, graph, kind, None)
    if kind == "join":
        assert bag(lake, "b") == Counter([i * 2 for i in ALL] + [i * 2 for i in range(100, 130)])
    else:
        assert bag(lake, "b") == expected_ids("once")
    if kind == "fork":
        assert bag(lake, "d") == expected_ids("once", 3)
    # Running again delivers nothing more.
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert sum(bag(lake, "b").values()) == (60 if kind == "join" else 30)


def test_at_least_once_rerun_keeps_the_delivery_hash(spark, lake):
    """The re-run after a crash before the positions is the same step (same number, same ranges),
    so its duplicates carry the original delivery hash: downstream can drop them by hash."""
    graph = build_graph("map", strategy=ALO)
    run_with_crash(spark, lake, graph, "map", CrashAt("after_commit", 2))
    b = lake.queue("b").read_arrow(partition="0")
    hashes: dict[int, set[str]] = {}
    for i, h in zip(b["id"].to_pylist(), b["_delivery_hash"].to_pylist(), strict=True):
        hashes.setdefault(i, set()).add(h)
    assert all(len(v) == 1 for v in hashes.values())
    assert len({h for v in hashes.values() for h in v}) == 3  # one per step


@pytest.mark.parametrize("strategy", [ALO, AMO])
def test_step_numbers_continue_across_restarts(spark, lake, strategy):
    """Regression: a restarted position-strategy processor numbered its steps from 0 again, so a
    sink keyed by step (write_delta_once) skipped every new step as "already applied"."""
    graph = build_graph("sink", strategy=strategy)
    run_with_crash(spark, lake, graph, "sink", None)
    lake.queue("a").append(rows(30, 30), partition="0")
    stats = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert [r.step for r in stats[PID].results] == [3, 4, 5]
    assert sorted(sink_rows(lake)["id"].to_pylist()) == [i * 2 for i in range(60)]


def test_at_least_once_sink_crash_before_positions_applies_once(spark, lake):
    """The sink's re-run has the same step and hash, so write_delta_once applies it once."""
    graph = build_graph("sink", strategy=ALO)
    run_with_crash(spark, lake, graph, "sink", CrashAt("after_commit", 2))
    assert sorted(sink_rows(lake)["id"].to_pylist()) == [i * 2 for i in ALL]
