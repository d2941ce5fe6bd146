"""Replaying error rows exactly once (issue 27 item 3, processing/replay.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cues_platform.audit import audit
from cues_platform.processing import (
    ERROR_SCHEMA,
    Graph,
    GraphRunner,
    In,
    Kind,
    Options,
    Out,
    Processor,
    QueueDef,
    Strategy,
)
from cues_platform.processing.backing import BackingQueue, ErrorRef
from cues_platform.processing.errors import ProcessorFencedError, RedeployError
from cues_platform.processing.history import processor_history
from cues_platform.processing.replay import (
    ReplayRefusedError,
    ReplaySelectionError,
    replay_errors,
    replayed_refs,
)
from cues_platform.queues import Lake
from tests.support import PAYLOAD, rows

ROOT = Path(__file__).resolve().parents[2]


class Poison(ValueError):
    """What the test function raises while a poison id is in its input."""


class Crash(BaseException):
    """A crash at a step protocol point (not an Exception: nothing handles it)."""


def _graph(poison: set[int], *, kind: Kind = Kind.MAP, strategy: Strategy = Strategy.EXACTLY_ONCE,
           **options) -> Graph:
    """Map ``p``: a -> b, raising while its input holds an id of ``poison`` (the set the test
    empties to "fix the function")."""

    def fn(ctx, src):
        ids = set(src.select("id").toArrow()["id"].to_pylist())
        if ids & poison:
            raise Poison(f"poison ids {sorted(ids & poison)}")
        return src

    queues = [QueueDef("a", PAYLOAD), QueueDef("b", PAYLOAD), QueueDef("errors", ERROR_SCHEMA)]
    opts = Options(**{"batch_size": 1_000, "max_batch_size": 1_000, "strategy": strategy, **options})
    outputs = {} if kind is Kind.SINK else {"out": Out("b", "0")}
    proc = Processor("p", kind, fn if kind is not Kind.SINK else (lambda ctx, src: None),
                     {"src": In("a", "0")}, outputs, options=opts)
    return Graph.build(name="replay", queues=queues, processors=[proc], error_queue="errors")


def _ids(lake: Lake) -> list[int]:
    return sorted(lake.queue("b").read_arrow(partition="0")["id"].to_pylist())


def _errors(lake: Lake) -> list[dict]:
    return lake.queue("errors").read_arrow(partition="0").to_pylist()


def _failed_run(spark, lake: Lake, poison: set[int], count: int = 100) -> Graph:
    graph = _graph(poison)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, count), partition="0")
    runner.run_until_idle()
    return graph


def test_replay_after_the_fix_delivers_each_failed_row_once_and_a_second_replay_does_nothing(
        spark, lake) -> None:
    poison = {13, 57}
    graph = _failed_run(spark, lake, poison)
    assert _ids(lake) == [i for i in range(100) if i not in poison]
    assert sorted(json.loads(e["inputs"])["src"][2] for e in _errors(lake)) == [13, 57]

    poison.clear()  # the user fixed the function
    first = replay_errors(graph=graph, processor="p", lake=lake, spark=spark)
    assert (first.selected, first.replayed, first.failed_again, first.already_replayed) == (2, 2, 0, 0)
    assert _ids(lake) == list(range(100))
    # each replay step is a step of the lane, logged by its attempt record, its hash new
    replays = [r for r in processor_history(lake, "p") if r.is_attempt and r.snapshot.replay]
    assert [r.snapshot.replay for r in replays] == [ErrorRef("errors", "0", 0), ErrorRef("errors", "0", 1)]
    assert [r.step for r in replays] == [1, 2]
    assert len({r.hash for r in replays}) == 2

    second = replay_errors(graph=graph, processor="p", lake=lake, spark=spark)
    assert (second.selected, second.replayed, second.already_replayed) == (2, 0, 2)
    assert _ids(lake) == list(range(100))
    assert len(_errors(lake)) == 2  # the error rows stay: the log says they were replayed
    report = audit(lake)
    assert not report.violations, report.violations


def test_the_lane_goes_on_from_its_own_positions_after_a_replay(spark, lake) -> None:
    poison = {5}
    graph = _failed_run(spark, lake, poison)
    poison.clear()
    replay_errors(graph=graph, processor="p", lake=lake, spark=spark)
    lake.queue("a").append(rows(100, 50), partition="0")
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert _ids(lake) == list(range(150))  # nothing of [0, 100) read again, [100, 150) once


def test_a_row_that_fails_again_is_a_new_error_row_replayable_later(spark, lake) -> None:
    poison = {13, 57}
    graph = _failed_run(spark, lake, poison)
    poison.discard(13)  # half fixed
    first = replay_errors(graph=graph, processor="p", lake=lake, spark=spark)
    assert (first.replayed, first.failed_again) == (1, 1)
    errors = _errors(lake)
    assert len(errors) == 3 and json.loads(errors[2]["inputs"]) == {"src": ["a", "0", 57, 58]}
    assert errors[2]["step"] == first.steps[1].step  # written by the replay step
    poison.clear()
    second = replay_errors(graph=graph, processor="p", lake=lake, spark=spark)
    # the two first rows are in the log; the new one is replayed
    assert (second.selected, second.already_replayed, second.replayed) == (3, 2, 1)
    assert _ids(lake) == list(range(100))


def test_where_chooses_rows_and_a_bad_condition_is_refused_before_anything(spark, lake) -> None:
    poison = {13, 57}
    graph = _failed_run(spark, lake, poison)
    poison.clear()
    with pytest.raises(ReplaySelectionError, match="no_such_column"):
        replay_errors(graph=graph, processor="p", lake=lake, spark=spark, where="no_such_column = 1")
    report = replay_errors(graph=graph, processor="p", lake=lake, spark=spark,
                           where="payload LIKE '%\"id\": 57%'")
    assert (report.selected, report.replayed) == (1, 1)
    assert _ids(lake) == [i for i in range(100) if i != 13]
    dry = replay_errors(graph=graph, processor="p", lake=lake, spark=spark, dry_run=True)
    assert (dry.selected, dry.already_replayed, dry.pending) == (2, 1, 1)
    assert _ids(lake) == [i for i in range(100) if i != 13]  # a dry run delivers nothing


@pytest.mark.parametrize("point, logged", [("after_prepare", False), ("after_attempt", True),
                                           ("after_commit", True)])
def test_a_crash_in_a_replay_step_is_finished_or_forgotten_never_doubled(spark, lake, point,
                                                                          logged) -> None:
    poison = {13}
    graph = _failed_run(spark, lake, poison)
    poison.clear()

    def crash(at: str) -> None:
        if at == point:
            raise Crash(at)

    with pytest.raises(Crash):
        replay_errors(graph=graph, processor="p", lake=lake, spark=spark, hook=crash)
    assert (ErrorRef("errors", "0", 0) in replayed_refs(BackingQueue(lake, "p"))) is logged
    again = replay_errors(graph=graph, processor="p", lake=lake, spark=spark)
    # recovery rolled a logged replay forward; an unlogged one is replayed now
    assert (again.replayed, again.already_replayed) == ((0, 1) if logged else (1, 0))
    assert _ids(lake) == list(range(100))
    assert not audit(lake).violations


def test_a_replay_fences_a_running_instance_of_the_lane(spark, lake) -> None:
    poison = {13}
    graph = _failed_run(spark, lake, poison)
    running = GraphRunner(graph=graph, lake=lake, spark=spark)
    running.run_until_idle()  # recovered and idle: holds the lane's epoch
    poison.clear()
    replay_errors(graph=graph, processor="p", lake=lake, spark=spark)
    lake.queue("a").append(rows(100, 10), partition="0")
    with pytest.raises(ProcessorFencedError):
        running.run_until_idle()
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert _ids(lake) == list(range(110))


def test_rows_that_cannot_be_read_again_are_reported_not_replayed(spark, lake) -> None:
    poison = {13}
    graph = _failed_run(spark, lake, poison)
    poison.clear()
    # a redeploy: the lane now reads partition "1" of a, not "0"
    queues = [QueueDef("a", PAYLOAD, partitions=("0", "1")), graph.queues["b"], graph.queues["errors"]]
    moved = Graph.build(name="replay", queues=queues, error_queue="errors",
                        processors=[Processor("p", Kind.MAP, graph.processors["p"].fn,
                                              {"src": In("a", "1")}, {"out": Out("b", "0")})])
    report = replay_errors(graph=moved, processor="p", lake=lake, spark=spark)
    assert report.replayed == 0 and len(report.unavailable) == 1
    assert "redeployed" in report.unavailable[0] and "errors/0@0" in report.unavailable[0]


@pytest.mark.parametrize("kind, strategy, options, reason", [
    (Kind.SINK, Strategy.EXACTLY_ONCE, {}, "sink"),
    (Kind.MAP, Strategy.AT_LEAST_ONCE, {}, "at_least_once"),
])
def test_processors_whose_replay_could_repeat_effects_are_refused(lake, kind, strategy, options,
                                                                  reason) -> None:
    graph = _graph(set(), kind=kind, strategy=strategy, **options)
    with pytest.raises(ReplayRefusedError, match=reason) as info:
        replay_errors(graph=graph, processor="p", lake=lake, spark=None)
    assert info.value.processor == "p" and not info.value.retryable


KILL_CHILD = """
import os, signal, sys
from cues_platform.processing.replay import replay_errors
from cues_platform.queues import Lake
from cues_platform.spark import get_spark
from tests.processing.test_replay import _graph

def hook(point):
    if point == sys.argv[2]:
        os.kill(os.getpid(), signal.SIGKILL)

replay_errors(graph=_graph(set()), processor="p", lake=Lake(root=sys.argv[1]), spark=get_spark(), hook=hook)
print("NOT KILLED", flush=True)
"""


@pytest.mark.parametrize("point, logged", [("after_prepare", False), ("after_attempt", True)])
def test_a_replay_killed_with_sigkill_is_finished_by_the_next_replay_once(spark, lake, point, logged) -> None:
    """A real process replaying the fixed function is SIGKILLed before / after its replay step's
    attempt record: the next replay delivers the row (not logged) or rolls the logged step
    forward and skips the row (logged); either way the row is in ``b`` once."""
    graph = _failed_run(spark, lake, {13, 57})
    child = subprocess.run([sys.executable, "-c", KILL_CHILD, lake.root, point], cwd=ROOT,
                           capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr[-3000:]
    assert (ErrorRef("errors", "0", 0) in replayed_refs(BackingQueue(lake, "p"))) is logged
    fixed = _graph(set())
    again = replay_errors(graph=fixed, processor="p", lake=lake, spark=spark)
    assert (again.already_replayed, again.replayed) == ((1, 1) if logged else (0, 2))
    assert _ids(lake) == list(range(100))
    assert (graph.processors["p"].id, len(_errors(lake))) == ("p", 2)


def test_contract_breaks_are_counted_and_never_replayed(spark, lake) -> None:
    from tests.processing.test_contracts import graph as contract_graph
    from tests.processing.test_contracts import load as load_payments

    graph = contract_graph()
    GraphRunner(graph=graph, lake=lake, spark=spark)
    load_payments(lake)
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    before = sorted(lake.queue("checked").read_arrow(partition="0")["id"].to_pylist())
    report = replay_errors(graph=graph, processor="check", lake=lake, spark=spark)
    assert (report.selected, report.refused_contract, report.replayed) == (3, 3, 0)
    assert "3 contract break(s) not replayable" in report.summary()
    assert sorted(lake.queue("checked").read_arrow(partition="0")["id"].to_pylist()) == before


def test_a_graph_that_cues_run_would_refuse_is_refused_before_any_replay_step(spark, lake) -> None:
    poison = {13}
    graph = _failed_run(spark, lake, poison)
    poison.clear()
    queues = [*graph.queues.values(), QueueDef("c", PAYLOAD)]
    rehomed = Graph.build(name="replay", queues=queues, error_queue="errors",
                          processors=[Processor("p", Kind.MAP, graph.processors["p"].fn,
                                                {"src": In("a", "0")}, {"out": Out("c", "0")})])
    steps = len(processor_history(lake, "p"))
    with pytest.raises(RedeployError, match="its first output is now .c."):
        replay_errors(graph=rehomed, processor="p", lake=lake, spark=spark)
    assert len(processor_history(lake, "p")) == steps  # no fence, no step


def test_each_lane_replays_its_own_rows(spark, lake) -> None:
    """``p`` over every partition of ``a`` runs one lane per partition; each error row is
    replayed by the lane that failed on it, in that lane's step sequence."""
    poison = {3, 105}

    def fn(ctx, src):
        ids = set(src.select("id").toArrow()["id"].to_pylist())
        if ids & poison:
            raise Poison(f"poison ids {sorted(ids & poison)}")
        return src

    queues = [QueueDef("a", PAYLOAD, partitions=("0", "1")), QueueDef("b", PAYLOAD, partitions=("0", "1")),
              QueueDef("errors", ERROR_SCHEMA)]
    graph = Graph.build(name="lanes", queues=queues, error_queue="errors",
                        processors=[Processor("p", Kind.MAP, fn, {"src": In("a")}, {"out": Out("b")})])
    GraphRunner(graph=graph, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 50), partition="0")
    lake.queue("a").append(rows(100, 50), partition="1")
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert sorted(e["processor"] for e in _errors(lake)) == ["p", "p.1"]
    poison.clear()
    report = replay_errors(graph=graph, processor="p", lake=lake, spark=spark)
    assert report.replayed == 2 and {s.step for s in report.steps} == {1}
    for part, first in (("0", 0), ("1", 100)):
        ids = sorted(lake.queue("b").read_arrow(partition=part)["id"].to_pylist())
        assert ids == list(range(first, first + 50))
    assert [r.snapshot.replay.offset for r in processor_history(lake, "p.1") if r.snapshot.replay] == [
        next(e["_offset"] for e in _errors(lake) if e["processor"] == "p.1")]
    assert not audit(lake).violations


def test_a_row_whose_input_retention_removed_is_reported_and_the_others_replayed(spark, lake) -> None:
    from cues_platform.queues.retention import delete_below

    poison = {13, 57}
    graph = _failed_run(spark, lake, poison)
    poison.clear()
    delete_below(lake.queue("a"), {"0": 50})  # the input of the row of 13 is gone, 57's is kept
    report = replay_errors(graph=graph, processor="p", lake=lake, spark=spark)
    assert report.replayed == 1 and len(report.unavailable) == 1
    assert "errors/0@0: a/0 [13, 14) is no longer in the queue (it starts at 50" in report.unavailable[0]
    assert _ids(lake) == [i for i in range(100) if i != 13]
