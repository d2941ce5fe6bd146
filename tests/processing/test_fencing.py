"""Fencing: two instances of one processor. Starting the newer one (its recovery commits a higher
epoch to the backing queue and to the home queue) makes the older one's next backing write or home
commit raise ProcessorFencedError, and no step is ever delivered twice (rows and delivery hashes
are checked exactly)."""

from __future__ import annotations

import threading

import pytest

from cues_platform.processing import (
    BackingQueue,
    GraphRunner,
    OutputWriter,
    ProcessorFencedError,
    SimulatedCrash,
)
from cues_platform.processing.home import read_home
from tests.processing.graphs import (
    PID,
    CrashAt,
    build_graph,
    check_exact,
    load_inputs,
    variant_options,
)
from tests.support import rows


class Calls:
    """A hook that runs ``action`` once, the ``occurrence``-th time ``point`` is reached."""

    def __init__(self, point: str, occurrence: int, action) -> None:
        self.point, self.occurrence, self.action, self.count = point, occurrence, action, 0
        self.seen: list[str] = []

    def __call__(self, point: str) -> None:
        self.seen.append(point)
        if point == self.point:
            self.count += 1
            if self.count == self.occurrence:
                self.action()


def test_older_instance_is_fenced_before_its_attempt(spark, lake):
    """The newer instance starts while the older one runs step 1's function: the older one's
    one commit is refused (the home queue's epoch is no longer its own), the newer one plans the
    same step from the stored positions and delivers it once."""
    graph = build_graph("map")
    newer: list[GraphRunner] = []
    hook = Calls("after_function", 2, lambda: newer.append(_started(graph, lake, spark)))
    older = GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook)
    load_inputs(lake, "map")
    with pytest.raises(ProcessorFencedError) as info:
        older.run_until_idle()
    assert info.value.step == 1 and info.value.epoch == 0 and info.value.newest == 1
    assert hook.seen[-1] == "after_prepare"  # stopped at its commit: nothing of step 1 written
    assert BackingQueue(lake, PID).epoch() == 1
    assert read_home(lake.queue("b"), graph.processors[PID]).epoch == 1
    newer[0].run_until_idle()
    check_exact(lake, "map", "output")


def test_older_instance_between_fork_commits_skips_what_the_newer_delivered(spark, lake):
    """The older instance stops between a fork's commits; the newer one starts, rolls the step
    forward and finishes everything; the older one resumes: its remaining (home) commit is fenced
    by the home queue's epoch, so it writes nothing more."""
    graph = build_graph("fork")

    def newer_runs_everything() -> None:
        GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()

    hook = Calls("between_commits", 2, newer_runs_everything)
    older = GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook)
    load_inputs(lake, "fork")
    with pytest.raises(ProcessorFencedError):
        older.run_until_idle()
    assert hook.seen[-1] == "between_commits"
    check_exact(lake, "fork", "output")


def test_idle_older_instance_is_fenced_at_its_next_snapshot(spark, lake):
    graph = build_graph("map")
    older = GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "map", n=10)
    older.run_until_idle()
    newer = GraphRunner(graph=graph, lake=lake, spark=spark)
    newer.recover()
    lake.queue("a").append(rows(10, 20), partition="0")
    with pytest.raises(ProcessorFencedError):
        older.run_until_idle()
    newer.run_until_idle()
    check_exact(lake, "map", "output")


def test_concurrent_instances_in_threads(spark, lake):
    """Instance A runs in a thread over 12 steps; after its step 2's function, instance B starts
    (fencing A) and both run concurrently: A fails at its next backing write, B finishes.
    Every step is delivered exactly once."""
    graph = build_graph("map", "output")
    a_ready, b_fenced = threading.Event(), threading.Event()

    def pause() -> None:
        a_ready.set()
        assert b_fenced.wait(timeout=120)

    failure: list[BaseException] = []

    def run_a() -> None:
        try:
            GraphRunner(graph=graph, lake=lake, spark=spark,
                        hook=Calls("after_function", 3, pause)).run_until_idle()
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            failure.append(exc)

    GraphRunner(graph=graph, lake=lake, spark=spark, only=[])  # creates the queues
    load_inputs(lake, "map", n=120)
    thread = threading.Thread(target=run_a)
    thread.start()
    assert a_ready.wait(timeout=300)
    b = GraphRunner(graph=graph, lake=lake, spark=spark)
    b.recover()
    b_fenced.set()
    b.run_until_idle()
    thread.join(timeout=300)
    assert not thread.is_alive()
    assert len(failure) == 1 and isinstance(failure[0], ProcessorFencedError), failure
    attempts = check_exact(lake, "map", "output", n=120)
    assert sorted(attempts) == list(range(12))
    assert len({a.hash for a in attempts.values()}) == 12


def test_fence_then_crash_leaves_a_recoverable_state(spark, lake):
    """An instance that crashed mid-step leaves only records of its own epoch behind."""
    graph = build_graph("fork", "output")
    hook = CrashAt("after_prepare", 2)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook)
    load_inputs(lake, "fork")
    with pytest.raises(SimulatedCrash):
        runner.run_until_idle()
    epochs = {r.epoch for r in BackingQueue(lake, PID).records()}
    assert epochs == {0}
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert {r.epoch for r in BackingQueue(lake, PID).records()} == {0, 1}
    check_exact(lake, "fork", "output")


def _started(graph, lake, spark) -> GraphRunner:
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    runner.recover()
    return runner


def test_fenced_instance_preparing_cannot_change_the_newer_attempts_outputs(spark, lake):
    """Regression: staged files were named by step only, so an older instance still preparing a
    step overwrote the files that the newer instance's attempt record pointed to. With a
    non-deterministic fork, the newer instance then committed its own data to b but the older
    one's to d. Now every attempt stages under unique names: b and d stay consistent."""
    from tests.processing.graphs import check_backing, random_fork_fn

    graph = build_graph("fork", fn=random_fork_fn())
    a_ready, go = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def pause() -> None:
        a_ready.set()
        assert go.wait(timeout=120)

    def run_a() -> None:
        try:
            GraphRunner(graph=graph, lake=lake, spark=spark,
                        hook=Calls("after_function", 2, pause)).run_until_idle()
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            failure.append(exc)

    GraphRunner(graph=graph, lake=lake, spark=spark, only=[])
    load_inputs(lake, "fork")
    thread = threading.Thread(target=run_a)
    thread.start()
    assert a_ready.wait(timeout=300)

    def let_a_prepare() -> None:  # B is between its commits of step 1: A now stages step 1
        go.set()
        thread.join(timeout=300)

    b = GraphRunner(graph=graph, lake=lake, spark=spark, hook=Calls("between_commits", 1, let_a_prepare))
    b.run_until_idle()
    assert not thread.is_alive()
    assert len(failure) == 1 and isinstance(failure[0], ProcessorFencedError), failure
    assert sorted(check_backing(lake)) == [0, 1, 2]
    left = lake.queue("b").read_arrow(partition="0").sort_by("_offset")["id"].to_pylist()
    right = lake.queue("d").read_arrow(partition="0").sort_by("_offset")["id"].to_pylist()
    assert len(left) == 30 and left == right


@pytest.mark.parametrize("writer", [OutputWriter.DRIVER, OutputWriter.EXECUTORS, "executors-based",
                                    "driver-parallel-files"])
def test_a_zombie_commit_racing_the_fence_is_refused(spark, lake, monkeypatch, writer):
    """The race itself: the older instance's home commit of step 1 has passed its epoch check when
    the newer instance fences the home queue. Both commits carry the app transaction
    ``epoch:{p}``, so Delta refuses the older one as a concurrent transaction; its retry reads the
    new epoch and raises ProcessorFencedError without writing. The newer one delivers step 1."""
    from cues_platform.processing import home as home_module

    parallel_calls: list[int] = []
    if writer == "executors-based":  # one Spark job, bases assigned by the (refused) commit
        graph = build_graph("map", **variant_options("based-executors"))
    elif writer == "driver-parallel-files":  # the step's files on threads (parallel_files.py),
        # its small steps over the threshold here: the refused commit leaves only orphan files
        from cues_platform.queues import parallel_files

        monkeypatch.setattr(parallel_files, "PARALLEL_MIN_ROWS", 2)
        monkeypatch.setattr(parallel_files, "cores", lambda: 2)
        written = parallel_files.write_parts
        monkeypatch.setattr(parallel_files, "write_parts",
                            lambda *a, **k: parallel_calls.append(1) or written(*a, **k))
        graph = build_graph("map", writer=OutputWriter.DRIVER)
    else:
        graph = build_graph("map", writer=writer)
    real_guard = home_module.home_guard
    newer: list[GraphRunner] = []

    def racing_guard(queue, pid, *, epoch, step):
        check = real_guard(queue, pid, epoch=epoch, step=step)

        def guard(dt):
            result = check(dt)  # the older instance's check passes on its snapshot ...
            if step == 1 and not newer:  # ... then the newer instance fences before it commits
                newer.append(_started(graph, lake, spark))
            return result

        return guard

    monkeypatch.setattr(home_module, "home_guard", racing_guard)
    older = GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "map")
    with pytest.raises(ProcessorFencedError) as info:
        older.run_until_idle()
    assert info.value.step == 1 and info.value.epoch == 0 and info.value.newest == 1
    home = read_home(lake.queue("b"), graph.processors[PID])
    assert home.step == 0 and home.epoch == 1  # the older commit of step 1 never landed
    monkeypatch.setattr(home_module, "home_guard", real_guard)
    newer[0].run_until_idle()
    check_exact(lake, "map", "output")
    assert bool(parallel_calls) == (writer == "driver-parallel-files")
