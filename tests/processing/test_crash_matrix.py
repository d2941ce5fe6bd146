"""Crash-point matrix of the exactly-once protocol: every kind x outcome x crash point.

Each case crashes step 1 (step 0 is already delivered) at one hook point, restarts with a new
GraphRunner on the same lake, runs until idle and checks the exact contents (``check_exact``):
every output row once, one error row per failing input row (a sink: per failed step) with its
processor/step/hash, sink side effects once, and a backing history of [snapshot, attempt] per step ending with an attempt.
In-process crashes raise SimulatedCrash; one SIGKILLed child process per kind covers real kills.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cues_platform.audit import audit
from cues_platform.processing import (
    BackingQueue,
    GraphRunner,
    RecordType,
    SimulatedCrash,
    UnhandledStepError,
)
from cues_platform.processing.home import read_home
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from tests.processing.graphs import (
    CHILD,
    KINDS,
    OUTCOMES,
    PID,
    STEP_POINTS,
    CrashAt,
    build_graph,
    check_backing,
    check_exact,
    ids_of,
    load_inputs,
    make_fn,
    random_fork_fn,
    variant_options,
)
from tests.support import ROOT, soak_enabled


def one_commit(kind: str, outcome: str) -> bool:
    """Whether step 1 takes the one-commit path: every row (or none) goes to the home queue b."""
    return kind != "sink" and (outcome == "nil" or (outcome == "output" and kind != "fork"))


def reached(kind: str, outcome: str, point: str) -> bool:
    """Whether step 1 passes ``point``: the attempt path has an attempt record, and commits
    before the home commit (error rows, a fork's second output); the one-commit path neither."""
    if point == "after_attempt":
        return not one_commit(kind, outcome)
    if point == "between_commits":
        return kind != "sink" and not one_commit(kind, outcome)
    return True


# Before its function returns, a non-sink step has recorded nothing (its snapshot goes into its
# commit), so crashing at after_snapshot or after_read leaves the lake exactly as crashing at
# after_function does. CI runs those equivalent points for sinks only (whose snapshot record makes
# them differ); CUES_SOAK=1 runs every point of every kind.
EQUIVALENT_TO_AFTER_FUNCTION = ("after_snapshot", "after_read")


def in_this_run(kind: str, point: str) -> bool:
    return soak_enabled() or kind == "sink" or point not in EQUIVALENT_TO_AFTER_FUNCTION


MATRIX = [(k, o, p) for k, o, p in itertools.product(KINDS, OUTCOMES, STEP_POINTS)
          if reached(k, o, p) and in_this_run(k, p)]
# in the middle of isolating a failing step's rows (processing/isolation.py): a sink is not isolated
MATRIX += [(k, "error", "after_isolation_call") for k in KINDS if k != "sink"]


def crash_then_recover(spark, lake: Lake, graph, hook: CrashAt, kind: str) -> None:
    runner = GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook)
    load_inputs(lake, kind)
    with pytest.raises(SimulatedCrash):
        runner.run_until_idle()
    assert hook.fired


@pytest.mark.parametrize(("kind", "outcome", "point"), MATRIX)
def test_crash_point_matrix(spark, lake, kind, outcome, point):
    graph = build_graph(kind, outcome)
    # Step 0 (block 0: output) takes the attempt path only for a fork or a sink, so an attempt-path
    # point of step 1 is the first one reached by the other kinds.
    attempt_only = point in ("after_attempt", "between_commits")
    occurrence = 1 if attempt_only and kind not in ("fork", "sink") else 2
    crash_then_recover(spark, lake, graph, CrashAt(point, occurrence=occurrence), kind)
    stats = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    attempts = check_exact(lake, kind, outcome)
    # A crash after the attempt record is finished by recovery (roll-forward), not recomputed;
    # after the home commit (or a one-commit step's commit) there is nothing left to finish.
    rolled = [r for r in stats[PID].results if r.recovered]
    if point in ("after_attempt", "between_commits") or (kind == "sink" and point == "after_commit"):
        assert len(rolled) == 1 and attempts[rolled[0].step].hash == rolled[0].delivery_hash
    elif kind != "sink":  # a sink's recovery re-resolves its last attempt (it has no home queue)
        assert rolled == []
    # Running again finds nothing to do and delivers nothing twice.
    again = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert all(r.recovered for r in again[PID].results)
    check_exact(lake, kind, outcome)


# The same crash points when a step's output is written by Spark's executors in one job into a
# queue with based offsets (queues/based.py): files written but not committed (after_prepare) are
# orphans, the step is planned again; the commit assigns the bases atomically.
BASED_MATRIX = [(k, p) for k, p in itertools.product(("map", "join", "alts"), STEP_POINTS)
                if reached(k, "output", p) and in_this_run(k, p)]


@pytest.mark.parametrize(("kind", "point"), BASED_MATRIX)
def test_crash_point_matrix_with_executor_written_based_files(spark, lake, kind, point):
    graph = build_graph(kind, "output", **variant_options("based-executors"))
    crash_then_recover(spark, lake, graph, CrashAt(point, occurrence=2), kind)
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    check_exact(lake, kind, "output")
    home = lake.queue("b")
    assert any(f.base for f in home.files()), "no file of the home queue has a base: not this path"
    report = audit(lake)  # the independent reader: every offset once, every step once
    assert report.ok, report.violations
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    check_exact(lake, kind, "output")


# -- crashes during recovery ---------------------------------------------------------------------
def test_crash_during_recovery_roll_forward(spark, lake):
    """A fork crashes between its commits; recovery crashes again between the same commits (the
    first queue is already committed, so the roll-forward skips it); a third start finishes."""
    graph = build_graph("fork")
    crash_then_recover(spark, lake, graph, CrashAt("between_commits", 2), "fork")
    # Queue d has step 1; the home queue b, committed last, does not yet.
    assert len(ids_of(lake, "d")) == 20 and len(ids_of(lake, "b")) == 10
    hook = CrashAt("between_commits", 1)
    with pytest.raises(SimulatedCrash):
        GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook).run_until_idle()
    assert hook.fired and hook.seen["recovery_fenced"] == 1 and hook.seen["before_snapshot"] == 0
    assert len(ids_of(lake, "b")) == 10 and len(ids_of(lake, "d")) == 20  # d not committed twice
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    check_exact(lake, "fork", "output")


@pytest.mark.parametrize("kind", KINDS)
def test_crash_at_recovery_fenced(spark, lake, kind):
    """Crash after the attempt record of step 1, then crash twice right after recovery fenced: each
    start has its own epoch, and the third start still rolls the attempt forward exactly once.
    (Step 1 of a map, join or alts takes the attempt path when it fails: its error row goes to the
    error queue, not to the home queue.)"""
    outcome = "output" if kind in ("fork", "sink") else "error"
    graph = build_graph(kind, outcome)
    crash_then_recover(spark, lake, graph, CrashAt("after_attempt", 2 if kind in ("fork", "sink") else 1), kind)
    for _ in range(2):
        hook = CrashAt("recovery_fenced", 1)
        with pytest.raises(SimulatedCrash):
            GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook).run_until_idle()
        assert hook.fired
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    check_exact(lake, kind, outcome)
    assert BackingQueue(lake, PID).epoch() == 3  # epochs 0..3: one per start
    if kind != "sink":
        assert read_home(lake.queue("b"), graph.processors[PID]).epoch == 3  # the same in home


def test_crash_after_snapshot_then_at_recovery_fenced(spark, lake):
    """A step that crashed before any record, then a recovery crashing at its fence: idempotent."""
    graph = build_graph("map", "error")
    crash_then_recover(spark, lake, graph, CrashAt("after_function", 1), "map")
    hook = CrashAt("recovery_fenced", 1)
    with pytest.raises(SimulatedCrash):
        GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook).run_until_idle()
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    check_exact(lake, "map", "error")


# -- alts: a crash before the commit leaves no choice behind ---------------------------------------
def test_alts_crash_before_commit_records_no_choice(spark, lake):
    """Only ``c`` (binding ``right``) has data when step 0 is planned; the step crashes before its
    commit, which records nothing; then ``a`` (binding ``left``) gets data. The restarted runner
    plans step 0 anew (either binding may be chosen: nothing of the crashed attempt is visible),
    and every row of both inputs is delivered once, each step reading only its chosen binding."""
    from tests.support import rows

    graph = build_graph("alts", "output")
    runner = GraphRunner(graph=graph, lake=lake, spark=spark, hook=CrashAt("after_function", 1))
    lake.queue("c").append(rows(100, 10), partition="0")
    with pytest.raises(SimulatedCrash):
        runner.run_until_idle()
    assert BackingQueue(lake, PID).last_record() is None and ids_of(lake, "b") == []
    assert read_home(lake.queue("b"), graph.processors[PID]).step == -1
    lake.queue("a").append(rows(0, 10), partition="0")
    # Crash the next attempt once more, right after it read its input.
    hook = CrashAt("after_read", 1)
    with pytest.raises(SimulatedCrash):
        GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook).run_until_idle()
    assert hook.fired
    stats = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    attempts = check_backing(lake, kind="alts")
    assert [r.step for r in stats[PID].results] == [0, 1]
    assert {a.snapshot.alts for a in attempts.values()} == {"left", "right"}
    for a in attempts.values():
        assert [b for b, r in a.snapshot.inputs.items() if r.size] == [a.snapshot.alts]
    b = lake.queue("b").read_arrow(partition="0")
    by_hash: dict[str, list[int]] = {}
    for i, h in zip(b["id"].to_pylist(), b["_delivery_hash"].to_pylist(), strict=True):
        by_hash.setdefault(h, []).append(i)
    expected = {"right": [i * 2 for i in range(100, 110)], "left": [i * 2 for i in range(10)]}
    assert {h: sorted(v) for h, v in by_hash.items()} == {
        a.hash: expected[a.snapshot.alts] for a in attempts.values()}


# -- a non-deterministic fork ---------------------------------------------------------------------
def test_nondeterministic_fork_is_consistent_after_crash_between_commits(spark, lake):
    """The function returns random numbers; crashing between the fork's commits must not compute
    them again: recovery commits the staged data, so both outputs carry the same numbers."""
    graph = build_graph("fork", fn=random_fork_fn())
    crash_then_recover(spark, lake, graph, CrashAt("between_commits", 2), "fork")
    # Crash once more during recovery's roll-forward, then finish.
    with pytest.raises(SimulatedCrash):
        GraphRunner(graph=graph, lake=lake, spark=spark,
                    hook=CrashAt("between_commits", 1)).run_until_idle()
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    attempts = check_backing(lake)
    assert sorted(attempts) == [0, 1, 2]
    b = lake.queue("b").read_arrow(partition="0").sort_by("_offset")
    d = lake.queue("d").read_arrow(partition="0").sort_by("_offset")
    assert b.num_rows == d.num_rows == 30
    assert b["id"].to_pylist() == d["id"].to_pylist()
    assert b["_delivery_hash"].to_pylist() == d["_delivery_hash"].to_pylist()
    assert sorted(i // 1_000_000 for i in b["id"].to_pylist()) == list(range(30))
    assert [sum(a.outputs["rows"]["b"].values()) for a in attempts.values()] == [10, 10, 10]


# -- unhandled errors ------------------------------------------------------------------------------
def test_unhandled_error_stops_and_the_fixed_function_retries_the_same_snapshot(spark, lake):
    """With no error queue a failing step stops the processor and records nothing; restarts plan
    the same ranges from the stored positions (same hash while no data arrives), and the fixed
    function delivers that step once."""
    graph = build_graph("map", "error", error_queue=False)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "map")
    with pytest.raises(UnhandledStepError) as info:
        runner.run_until_idle()
    assert info.value.retryable and info.value.step == 1
    failed_hash = info.value.delivery_hash
    assert BackingQueue(lake, PID).last_record() is None  # nothing recorded for step 1
    home = read_home(lake.queue("b"), graph.processors[PID])
    assert home.step == 0 and home.positions == {"src": 10}
    assert ids_of(lake, "b") == [i * 2 for i in range(10)]  # step 1 delivered nothing
    # Restarting with the same broken function fails the same way, on the same ranges.
    with pytest.raises(UnhandledStepError) as again:
        GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert again.value.delivery_hash == failed_hash
    fixed = build_graph("map", "output", error_queue=False, fn=make_fn("map", "output"))
    stats = GraphRunner(graph=fixed, lake=lake, spark=spark).run_until_idle()
    assert stats[PID].results[0].step == 1 and stats[PID].results[0].delivery_hash == failed_hash
    check_exact(lake, "map", "output")


# -- SIGKILL of a child process, one row per kind ------------------------------------------------
KILLS = {  # case -> (kind, outcome, point, occurrence)
    "map": ("map", "output", "after_commit", 2),  # the one commit of step 1 is made, nothing after it
    "join": ("join", "error", "after_attempt", 1),  # step 1 fails: its error rows are staged (attempt path)
    "alts": ("alts", "nil", "after_prepare", 2),  # nothing of step 1 recorded
    "fork": ("fork", "output", "between_commits", 2),
    "sink": ("sink", "output", "after_function", 2),  # the side effect happened, the attempt did not
    # killed in the middle of isolating step 1's failing rows (its 5th call): nothing recorded
    "map-isolating": ("map", "error", "after_isolation_call", 5),
    # Spark's executors wrote step 1's files into a queue with based offsets; no commit yet
    "map-based-written": ("map", "output", "after_prepare", 2, "based-executors"),
    # ... and the commit that assigned their bases is made
    "map-based-committed": ("map", "output", "after_commit", 2, "based-executors"),
}


@pytest.fixture(scope="module", autouse=True)
def killed_children(request, tmp_path_factory):
    """Start every selected SIGKILL child when the module starts (each starts its own Spark, which
    takes a while): they run while the in-process matrix runs, and their tests come last."""
    selected = {item.callspec.params["case"] for item in request.session.items
                if item.module is request.module and item.originalname == "test_sigkill_child_then_recover"}
    children = {}
    for case, (kind, outcome, point, occurrence, *variant) in KILLS.items():
        if case not in selected:
            continue
        root = tmp_path_factory.mktemp(f"kill-{case}") / "lake"
        lake = Lake(root=str(root))
        create_queues(build_graph(kind, outcome, **variant_options(*variant)), lake)
        load_inputs(lake, kind)
        log = open(Path(str(root) + ".log"), "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(root), kind, outcome, point,
                                 str(occurrence), *variant], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        children[case] = (lake, proc, log)
    yield children
    for _lake, proc, log in children.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.parametrize("case", list(KILLS))
def test_sigkill_child_then_recover(spark, killed_children, case):
    lake, proc, log = killed_children[case]
    kind, outcome, point, _, *variant = KILLS[case]
    rc = proc.wait(timeout=300)
    log.flush()
    output = Path(log.name).read_text()
    assert rc == -signal.SIGKILL, f"child exited {rc}:\n{output[-3000:]}"
    assert "NOT KILLED" not in output
    last = BackingQueue(lake, PID).last_record()
    graph = build_graph(kind, outcome, **variant_options(*variant))
    if point in ("after_attempt", "between_commits"):
        assert last.is_attempt and last.step == 1
    elif kind == "sink":
        assert last.type is RecordType.SNAPSHOT and last.step == 1
    else:  # one-commit path: the home queue alone says how far the processor got
        assert last is None
        home = read_home(lake.queue("b"), graph.processors[PID])
        assert home.step == (1 if point == "after_commit" else 0)
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    check_exact(lake, kind, outcome)
    if variant:  # the independent reader over the based files
        report = audit(lake)
        assert report.ok, report.violations


def test_the_same_runner_recovers_before_stepping_again_after_a_failed_step(spark, lake):
    """A step that failed between a fork's commits is rolled forward by the SAME runner on its next
    step (recovery first), not prepared again: outputs stay consistent and exactly once."""
    graph = build_graph("fork", fn=random_fork_fn())
    crash = CrashAt("between_commits", 2)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark, hook=crash)
    load_inputs(lake, "fork")
    with pytest.raises(SimulatedCrash):
        runner.run_until_idle()
    runner.run_until_idle()  # same object: recovers the fork first, then finishes
    attempts = check_backing(lake)
    assert sorted(attempts) == [0, 1, 2]
    b = lake.queue("b").read_arrow(partition="0").sort_by("_offset")
    d = lake.queue("d").read_arrow(partition="0").sort_by("_offset")
    assert b["id"].to_pylist() == d["id"].to_pylist() and b.num_rows == 30
    assert runner.stats[PID].recovered == 1
