"""The crash-point matrix over a processor that reads every partition (processing/lanes.py).

The graph of the crash matrix, its queues given partitions "0" and "x": lanes ``p`` and ``p.x``,
stepped in turn by one runner. Lane ``p.x`` crashes at one hook point of its step 1 (the block the
outcome switch applies to) while lane ``p`` goes on; a new runner recovers; then every lane's
output partition, error rows, backing history and the sink's effects are exact (``check_exact``
per lane). CI runs one case per kind and protocol path; ``CUES_SOAK=1`` the whole matrix.
"""

from __future__ import annotations

import pytest

from cues_platform.processing import GraphRunner, SimulatedCrash
from tests.processing.graphs import (
    PID,
    CrashAt,
    build_lanes_graph,
    check_lanes_exact,
    load_lane_inputs,
)
from tests.processing.test_crash_matrix import MATRIX
from tests.support import soak_enabled

LANE = f"{PID}.x"
BOUNDED = [  # (kind, outcome, point): each kind, each path (one commit / attempt), early and late
    ("map", "output", "after_function"),
    ("map", "error", "after_attempt"),
    ("join", "output", "after_commit"),
    ("alts", "error", "between_commits"),
    ("fork", "output", "between_commits"),
    ("sink", "output", "after_snapshot"),
]
CASES = MATRIX if soak_enabled() else BOUNDED


@pytest.mark.parametrize(("kind", "outcome", "point"), CASES)
def test_a_crash_in_one_lane_while_the_other_goes_on(spark, lake, kind, outcome, point):
    graph = build_lanes_graph(kind, outcome)
    assert graph.families == {PID: [PID, LANE]}
    attempt_only = point in ("after_attempt", "between_commits")
    hook = CrashAt(point, occurrence=1 if attempt_only and kind not in ("fork", "sink") else 2)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    runner.steppers[LANE].hook = hook  # only lane p.x crashes; lane p steps between its steps
    load_lane_inputs(lake, kind)
    with pytest.raises(SimulatedCrash):
        runner.run_until_idle()
    assert hook.fired and runner.stats[PID].steps >= 2  # the other lane delivered meanwhile
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    check_lanes_exact(lake, kind, outcome)
    again = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert all(r.recovered for stats in again.values() for r in stats.results)
    check_lanes_exact(lake, kind, outcome)
