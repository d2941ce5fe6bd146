"""Crash-point matrix of the exactly-once protocol: every kind x outcome x crash point.

Each case crashes step 1 (step 0 is already delivered) at one hook point, restarts with a new
GraphRunner on the same lake, runs until idle and checks the exact contents (``check_exact``):
every output row once, one error row per failed step with its processor/step/hash, sink side
effects once, and a backing history of [snapshot, attempt] per step ending with an attempt.
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

from cues_platform.processing import (
    BackingQueue,
    GraphRunner,
    RecordType,
    SimulatedCrash,
    UnhandledStepError,
)
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
)
from tests.support import ROOT

MATRIX = [(k, o, p) for k, o, p in itertools.product(KINDS, OUTCOMES, STEP_POINTS)
          if p != "between_commits" or k == "fork"]


def crash_then_recover(spark, lake: Lake, graph, hook: CrashAt, kind: str) -> None:
    runner = GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook)
    load_inputs(lake, kind)
    with pytest.raises(SimulatedCrash):
        runner.run_until_idle()
    assert hook.fired


@pytest.mark.parametrize(("kind", "outcome", "point"), MATRIX)
def test_crash_point_matrix(spark, lake, kind, outcome, point):
    graph = build_graph(kind, outcome)
    crash_then_recover(spark, lake, graph, CrashAt(point, occurrence=2), kind)
    stats = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    attempts = check_exact(lake, kind, outcome)
    # A crash after the attempt record is finished by recovery (roll-forward), not recomputed.
    rolled = [r for r in stats[PID].results if r.recovered]
    if point in ("after_attempt", "between_commits", "after_commit"):
        assert len(rolled) == 1 and attempts[rolled[0].step].hash == rolled[0].delivery_hash
    # Running again finds nothing to do and delivers nothing twice.
    again = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert all(r.recovered for r in again[PID].results)
    check_exact(lake, kind, outcome)


# -- crashes during recovery ---------------------------------------------------------------------
def test_crash_during_recovery_roll_forward(spark, lake):
    """A fork crashes between its commits; recovery crashes again between the same commits (the
    first queue is already committed, so the roll-forward skips it); a third start finishes."""
    graph = build_graph("fork")
    crash_then_recover(spark, lake, graph, CrashAt("between_commits", 2), "fork")
    # Queue b has step 1, queue d does not yet.
    assert len(ids_of(lake, "b")) == 20 and len(ids_of(lake, "d")) == 10
    hook = CrashAt("between_commits", 1)
    with pytest.raises(SimulatedCrash):
        GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook).run_until_idle()
    assert hook.fired and hook.seen["recovery_fenced"] == 1 and hook.seen["before_snapshot"] == 0
    assert len(ids_of(lake, "d")) == 10  # still not rolled forward
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    check_exact(lake, "fork", "output")


@pytest.mark.parametrize("kind", KINDS)
def test_crash_at_recovery_fenced(spark, lake, kind):
    """Crash after the attempt record, then crash twice right after recovery fenced: each start
    has its own epoch, and the third start still rolls the attempt forward exactly once."""
    graph = build_graph(kind, "output")
    crash_then_recover(spark, lake, graph, CrashAt("after_attempt", 2), kind)
    for _ in range(2):
        hook = CrashAt("recovery_fenced", 1)
        with pytest.raises(SimulatedCrash):
            GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook).run_until_idle()
        assert hook.fired
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    check_exact(lake, kind, "output")
    assert BackingQueue(lake, PID).epoch() == 3  # epochs 0..3: one per start


def test_crash_after_snapshot_then_at_recovery_fenced(spark, lake):
    """Recovery from a snapshot record (retry) crashing at its fence is also idempotent."""
    graph = build_graph("map", "error")
    crash_then_recover(spark, lake, graph, CrashAt("after_function", 1), "map")
    hook = CrashAt("recovery_fenced", 1)
    with pytest.raises(SimulatedCrash):
        GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook).run_until_idle()
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    check_exact(lake, "map", "error")


# -- alts: a retry reads the binding of the first attempt ----------------------------------------
def test_alts_retry_reads_the_same_binding(spark, lake):
    """Only ``c`` (binding ``right``) has data when step 0 is snapshotted; the step crashes; then
    ``a`` (binding ``left``) gets data. A restarted runner would pick ``left`` first for a new step,
    but the retry reads ``right`` again (same snapshot, same hash); ``a`` is read by step 1."""
    from tests.support import rows

    graph = build_graph("alts", "output")
    runner = GraphRunner(graph=graph, lake=lake, spark=spark, hook=CrashAt("after_function", 1))
    lake.queue("c").append(rows(100, 10), partition="0")
    with pytest.raises(SimulatedCrash):
        runner.run_until_idle()
    first = BackingQueue(lake, PID).last_record()
    assert first.type is RecordType.SNAPSHOT and first.snapshot.alts == "right"
    lake.queue("a").append(rows(0, 10), partition="0")
    # Crash the retry once more, right after it read its input.
    hook = CrashAt("after_read", 1)
    with pytest.raises(SimulatedCrash):
        GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook).run_until_idle()
    assert hook.fired
    stats = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    attempts = check_backing(lake)
    assert attempts[0].snapshot.alts == "right" and attempts[0].hash == first.hash
    assert attempts[0].snapshot.inputs["right"].size == 10
    assert attempts[0].snapshot.inputs["left"].size == 0
    assert attempts[1].snapshot.alts == "left"
    assert [r.step for r in stats[PID].results] == [0, 1]
    b = lake.queue("b").read_arrow(partition="0")
    by_hash: dict[str, list[int]] = {}
    for i, h in zip(b["id"].to_pylist(), b["_delivery_hash"].to_pylist(), strict=True):
        by_hash.setdefault(h, []).append(i)
    assert {h: sorted(v) for h, v in by_hash.items()} == {
        attempts[0].hash: [i * 2 for i in range(100, 110)],
        attempts[1].hash: [i * 2 for i in range(10)]}


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
    graph = build_graph("map", "error", error_queue=False)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "map")
    with pytest.raises(UnhandledStepError) as info:
        runner.run_until_idle()
    assert info.value.retryable
    last = BackingQueue(lake, PID).last_record()
    assert last.type is RecordType.SNAPSHOT and last.step == 1
    assert ids_of(lake, "b") == [i * 2 for i in range(10)]  # step 1 delivered nothing
    # Restarting with the same broken function fails the same way, on the same snapshot.
    with pytest.raises(UnhandledStepError):
        GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert BackingQueue(lake, PID).last_record().hash == last.hash
    fixed = build_graph("map", "output", error_queue=False, fn=make_fn("map", "output"))
    stats = GraphRunner(graph=fixed, lake=lake, spark=spark).run_until_idle()
    assert stats[PID].results[0].step == 1 and stats[PID].results[0].delivery_hash == last.hash
    check_exact(lake, "map", "output")


# -- SIGKILL of a child process, one row per kind ------------------------------------------------
KILLS = {  # kind -> (outcome, point, occurrence)
    "map": ("output", "after_attempt", 2),
    "join": ("error", "after_attempt", 2),  # step 1 is the failing one: its error row is staged
    "alts": ("nil", "after_prepare", 2),
    "fork": ("output", "between_commits", 2),
    "sink": ("output", "after_function", 2),  # the side effect happened, the attempt did not
}


@pytest.fixture(scope="module", autouse=True)
def killed_children(request, tmp_path_factory):
    """Start every selected SIGKILL child when the module starts (each starts its own Spark, which
    takes a while): they run while the in-process matrix runs, and their tests come last."""
    selected = {item.callspec.params["kind"] for item in request.session.items
                if item.module is request.module and item.originalname == "test_sigkill_child_then_recover"}
    children = {}
    for kind, (outcome, point, occurrence) in KILLS.items():
        if kind not in selected:
            continue
        root = tmp_path_factory.mktemp(f"kill-{kind}") / "lake"
        lake = Lake(root=str(root))
        create_queues(build_graph(kind, outcome), lake)
        load_inputs(lake, kind)
        log = open(Path(str(root) + ".log"), "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(root), kind, outcome, point,
                                 str(occurrence)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        children[kind] = (lake, proc, log)
    yield children
    for _lake, proc, log in children.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.parametrize("kind", list(KILLS))
def test_sigkill_child_then_recover(spark, killed_children, kind):
    lake, proc, log = killed_children[kind]
    outcome, point, _ = KILLS[kind]
    rc = proc.wait(timeout=300)
    log.flush()
    output = Path(log.name).read_text()
    assert rc == -signal.SIGKILL, f"child exited {rc}:\n{output[-3000:]}"
    assert "NOT KILLED" not in output
    last = BackingQueue(lake, PID).last_record()
    if point in ("after_attempt", "between_commits"):
        assert last.is_attempt and last.step == 1
    else:
        assert last.type is RecordType.SNAPSHOT and last.step == 1
    GraphRunner(graph=build_graph(kind, outcome), lake=lake, spark=spark).run_until_idle()
    check_exact(lake, kind, outcome)


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
