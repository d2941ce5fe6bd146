"""Isolation (issue 27): one bad row costs one row, exactly once (processing/isolation.py)."""

from __future__ import annotations

import json
import math
import threading

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from cues_platform.audit import audit
from cues_platform.processing import (
    ERROR_SCHEMA,
    Graph,
    GraphRunner,
    In,
    Kind,
    OnError,
    Options,
    Out,
    Processor,
    QueueDef,
    RecordType,
)
from cues_platform.processing.backing import Range
from cues_platform.processing.errors import PlatformStepError, SimulatedCrash
from cues_platform.processing.failures import Origin, Phase, StepFailure, origin_of
from cues_platform.processing.history import processor_history
from cues_platform.processing.isolation import Failing, call_budget, isolate
from cues_platform.queues import Lake
from tests.processing.test_failures import MoveAway
from tests.support import PAYLOAD, rows


class Poison(ValueError):
    """What the test functions raise on a poison row."""


def _udf_failing_on(poison: frozenset[int]):
    """A Python UDF that raises on the executor for the poison ids (a failure Spark reports from
    a task: classified as the function's own)."""

    def check(i: int) -> int:
        if i in poison:
            raise Poison(f"poison id {i}")
        return i * 2

    return F.udf(check, LongType())


def _graph(fn, *, kind: Kind = Kind.MAP, inputs=None, outputs=None, **options) -> Graph:
    queues = [QueueDef("a", PAYLOAD), QueueDef("b", PAYLOAD), QueueDef("c", PAYLOAD), QueueDef("d", PAYLOAD),
              QueueDef("errors", ERROR_SCHEMA)]
    opts = Options(**{"batch_size": 1_000, "max_batch_size": 1_000, **options})
    proc = Processor("p", kind, fn, inputs or {"src": In("a", "0")}, outputs or {"out": Out("b", "0")},
                     options=opts)
    return Graph.build(name="iso", queues=queues, processors=[proc], error_queue="errors")


def _errors(lake: Lake) -> list[dict]:
    return sorted(lake.queue("errors").read_arrow(partition="0").to_pylist(), key=lambda e: e["inputs"])


def _ids(lake: Lake, queue: str) -> list[int]:
    return sorted(lake.queue(queue).read_arrow(partition="0")["id"].to_pylist())


def test_a_udf_failing_on_one_row_costs_that_row_only(spark, lake) -> None:
    calls: list[tuple[int, int]] = []
    check = _udf_failing_on(frozenset({13}))

    def fn(ctx, src):
        r = ctx.inputs["src"]
        calls.append((r.start, r.end))
        return src.select(check(F.col("id")).alias("id"), F.col("note"))

    graph = _graph(fn)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 100), partition="0")
    runner.run_until_idle()

    assert _ids(lake, "b") == [i * 2 for i in range(100) if i != 13]
    [error] = _errors(lake)
    assert json.loads(error["inputs"]) == {"src": ["a", "0", 13, 14]}
    assert json.loads(error["payload"]) == {"id": 13, "note": "n13"}
    assert "poison id 13" in error["message"] and error["step"] == 0
    # one whole call, then two calls per level down to the row: 2 * ceil(log2(100))
    assert calls[0] == (0, 100) and len(calls) - 1 <= 2 * math.ceil(math.log2(100))
    # one step, one outcome: the good rows and the error row carry the step's hash
    [attempt] = [r for r in processor_history(lake, "p") if r.is_attempt]
    assert attempt.type is RecordType.ATTEMPT_OUTPUT
    assert attempt.outputs["rows"] == {"b": {"0": 99}, "errors": {"0": 1}}
    hashes = {*lake.queue("b").read_arrow(partition="0")["_delivery_hash"].to_pylist(), error["_delivery_hash"]}
    assert hashes == {attempt.hash}
    assert not audit(lake).violations


def test_a_driver_side_failure_isolates_several_rows_with_a_bounded_number_of_calls(spark, lake) -> None:
    poison = {3, 500, 997}
    calls = []
    halves = threading.Barrier(2, timeout=120)  # the step's two halves are called at once
    threads = set()

    def fn(ctx, src):
        calls.append(ctx.inputs["src"])
        threads.add(threading.current_thread().name)
        if ctx.inputs["src"].size == 500:
            halves.wait()
        ids = set(src.select("id").toArrow()["id"].to_pylist())  # the function itself looks at rows
        if ids & poison:
            raise Poison(f"poison ids {sorted(ids & poison)}")
        return src

    runner = GraphRunner(graph=_graph(fn), lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 1_000), partition="0")
    runner.run_until_idle()

    assert _ids(lake, "b") == [i for i in range(1_000) if i not in poison]
    errors = _errors(lake)
    assert sorted(json.loads(e["inputs"])["src"][2] for e in errors) == sorted(poison)
    assert all(e["exception_type"].endswith("Poison") for e in errors)
    k, n = len(poison), 1_000
    assert len(calls) - 1 <= 2 * k * math.ceil(math.log2(n))
    assert len(threads) > 1  # the step's own call, then calls from isolation's threads, 2 at once
    assert not audit(lake).violations


def test_whole_step_keeps_one_error_row_for_the_step(spark, lake) -> None:
    check = _udf_failing_on(frozenset({13}))
    graph = _graph(lambda ctx, src: src.select(check(F.col("id")).alias("id"), F.col("note")),
                   on_error=OnError.WHOLE_STEP)
    GraphRunner(graph=graph, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 100), partition="0")
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert _ids(lake, "b") == []
    [error] = _errors(lake)
    assert json.loads(error["inputs"]) == {"src": ["a", "0", 0, 100]} and error["payload"] is None
    assert not audit(lake).violations


def test_a_spent_budget_gives_each_row_of_a_still_failing_range_an_error_row(spark, lake) -> None:
    check = _udf_failing_on(frozenset({13}))
    graph = _graph(lambda ctx, src: src.select(check(F.col("id")).alias("id"), F.col("note")),
                   max_isolation_calls=4)
    GraphRunner(graph=graph, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 100), partition="0")
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    errors = _errors(lake)
    failing = sorted(json.loads(e["inputs"])["src"][2] for e in errors)
    delivered = _ids(lake, "b")
    # every input row once: delivered (doubled) or in the error queue, never both, never neither
    assert sorted([i // 2 for i in delivered] + failing) == list(range(100))
    assert 13 in failing and len(failing) > 1
    assert all("max_isolation_calls = 4 spent" in e["message"] for e in errors
               if json.loads(e["payload"])["id"] != 13)
    assert not audit(lake).violations


def test_a_join_isolates_its_streaming_side_and_a_fork_delivers_both_outputs(spark, lake) -> None:
    check = _udf_failing_on(frozenset({7}))

    def join(ctx, big, small):
        return big.select(check(F.col("id")).alias("id"), F.col("note")).unionByName(small.select("id", "note"))

    def fork(ctx, src):
        doubled = src.select(check(F.col("id")).alias("id"), F.col("note"))
        return {"left": doubled, "right": src}

    jgraph = _graph(join, kind=Kind.JOIN, inputs={"big": In("a", "0"), "small": In("c", "0")})
    GraphRunner(graph=jgraph, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 40), partition="0")
    lake.queue("c").append(rows(1_000, 2), partition="0")
    GraphRunner(graph=jgraph, lake=lake, spark=spark).run_until_idle()
    # the small side is given whole to every call that succeeded: its rows once per good call
    got = lake.queue("b").read_arrow(partition="0")["id"].to_pylist()
    assert sorted(i for i in got if i < 1_000) == [i * 2 for i in range(40) if i != 7]
    [error] = _errors(lake)
    assert json.loads(error["inputs"]) == {"big": ["a", "0", 7, 8], "small": ["c", "0", 0, 2]}
    assert not audit(lake).violations

    other = Lake(root=lake.root + "-fork")
    fgraph = _graph(fork, kind=Kind.FORK, outputs={"left": Out("b", "0"), "right": Out("d", "0")})
    GraphRunner(graph=fgraph, lake=other, spark=spark)
    other.queue("a").append(rows(0, 40), partition="0")
    GraphRunner(graph=fgraph, lake=other, spark=spark).run_until_idle()
    assert _ids(other, "b") == [i * 2 for i in range(40) if i != 7]
    assert _ids(other, "d") == [i for i in range(40) if i != 7]
    assert len(_errors(other)) == 1 and not audit(other).violations


def test_a_platform_failure_during_isolation_delivers_nothing_and_the_next_start_isolates_again(
        spark, lake, tmp_path) -> None:
    """The input's data files vanish after the first isolation call (a platform failure, not the
    function's): the step stops with nothing delivered or recorded; with the files back, the next
    start plans the same step, with the same hash, and isolates again."""
    check = _udf_failing_on(frozenset({13}))
    graph = _graph(lambda ctx, src: src.select(check(F.col("id")).alias("id"), F.col("note")))
    GraphRunner(graph=graph, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 100), partition="0")
    away = MoveAway(lake, "a", "after_isolation_call", tmp_path / "away")
    with pytest.raises(PlatformStepError) as info:
        GraphRunner(graph=graph, lake=lake, spark=spark, hook=away).run_until_idle()
    assert away.moved and info.value.step == 0
    assert _ids(lake, "b") == [] and _errors(lake) == []
    assert processor_history(lake, "p") == []  # nothing recorded: the step is planned again
    away.restore()
    stats = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert stats["p"].results[0].delivery_hash == info.value.delivery_hash
    assert _ids(lake, "b") == [i * 2 for i in range(100) if i != 13] and len(_errors(lake)) == 1
    assert not audit(lake).violations


class ReverseGate:
    """A ``call`` wrapper for calls from several threads: each call, its work done, waits until
    every call started after it has ended, so calls running together end in the REVERSE order of
    their start (the latest started never waits: no deadlock). Records the order calls end in."""

    def __init__(self, call, *, deadline: float = 30.0) -> None:
        self.call, self.deadline = call, deadline
        self.lock = threading.Condition()
        self.started: list[tuple[int, int]] = []
        self.ended: list[tuple[int, int]] = []
        self.running = 0
        self.most_running = 0

    def __call__(self, start: int, end: int):
        with self.lock:
            mine = len(self.started)
            self.started.append((start, end))
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            return self.call(start, end)
        finally:
            with self.lock:
                later = self.started[mine + 1:]
                if not self.lock.wait_for(lambda: all(r in self.ended for r in later), timeout=self.deadline):
                    raise AssertionError(f"call {(start, end)}: later calls never ended: {later}")
                self.ended.append((start, end))
                self.running -= 1
                self.lock.notify_all()


def _poisoned_call(poison: set[int], alone_failed: set[int] | None = None):
    def call(start: int, end: int) -> dict[str, pa.Table]:
        bad = [o for o in range(start, end) if o in poison]
        if bad:
            if end - start == 1 and alone_failed is not None:
                alone_failed.add(start)
            raise StepFailure(Poison(str(bad)), Phase.FUNCTION)
        return {"out": pa.table({"o": list(range(start, end))})}

    return call


def _found(found) -> tuple:
    """What an isolation found, comparable between runs."""
    failing = [(f.offset, f.isolated, f.within, str(f.cause)) for f in found.failing]
    good = [(start, out["out"]["o"].to_pylist()) for start, out in found.good]
    return failing, good, found.calls


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(min_value=1, max_value=300), data=st.data())
def test_isolate_partitions_the_range_and_names_only_proven_rows(n, data) -> None:
    """Without Spark: the halves that succeed and the failing offsets partition [0, n) exactly;
    an offset is failing (isolated) only if a call on it alone failed; calls stay within budget;
    with calls run from several threads and ending in reverse order, or a wider first split, what
    is found is the same as one call after another would find with that split."""
    poison = data.draw(st.sets(st.integers(min_value=0, max_value=n - 1), min_size=1, max_size=8))
    budget = data.draw(st.integers(min_value=0, max_value=400))
    workers = data.draw(st.sampled_from([1, 2, 4]))
    first_split = data.draw(st.sampled_from([2, 3, 8, 16]))
    alone_failed: set[int] = set()
    after: list[str] = []
    gate = ReverseGate(_poisoned_call(poison, alone_failed))

    found = isolate(binding="src", whole=Range("a", "0", 0, n), first=Poison("whole"), call=gate,
                    max_calls=budget, workers=workers, first_split=first_split,
                    after_call=lambda: after.append(threading.current_thread().name))
    delivered = found.outputs()["out"]["o"].to_pylist() if found.good else []
    failing = [f.offset for f in found.failing]
    assert delivered == sorted(delivered)  # offset order
    assert sorted(delivered + failing) == list(range(n))
    assert found.calls <= budget and found.calls == len(gate.started) == len(after)
    assert set(after) <= {threading.current_thread().name}  # after_call: on the calling thread
    assert gate.most_running <= workers
    isolated = {f.offset for f in found.failing if f.isolated}
    assert isolated <= alone_failed | ({0} if n == 1 else set())
    assert poison <= set(failing)
    levels = max(1, math.ceil(math.log2(n)))
    if budget >= first_split + 2 * len(poison) * levels:
        assert set(failing) == poison and all(isinstance(f, Failing) and f.isolated for f in found.failing)
    # independent of threads and of the order calls end in
    alone = isolate(binding="src", whole=Range("a", "0", 0, n), first=Poison("whole"),
                    call=_poisoned_call(poison), max_calls=budget, workers=1, first_split=first_split)
    assert _found(found) == _found(alone)
    if first_split == 2 and budget >= 2 * len(poison) * levels:  # the search as it always was
        assert found.calls == _sequential_halving_calls(0, n, poison)


def _sequential_halving_calls(start: int, end: int, poison: set[int]) -> int:
    """The calls the depth-first halving (the search before it went level by level) makes on a
    failing range, with budget enough."""
    if end - start == 1:
        return 0
    middle = (start + end) // 2
    return 2 + sum(_sequential_halving_calls(lo, hi, poison) for lo, hi in ((start, middle), (middle, end))
                   if any(lo <= p < hi for p in poison))


def test_calls_of_a_level_run_together_and_end_in_any_order_without_changing_the_result() -> None:
    """20 poison offsets in 4,000: the levels hold more pieces than workers. The 4 calls of the
    second level (quarters) wait for each other (a barrier: they can only pass it together), so
    4 calls ran at once; calls ended out of their start order; the outcome is the search's."""
    poison = {i * 200 + 7 for i in range(20)}
    quarters = threading.Barrier(4, timeout=30)
    inner = _poisoned_call(poison)

    def call(start: int, end: int):
        if end - start == 1_000:
            quarters.wait()
        return inner(start, end)

    gate = ReverseGate(call)
    found = isolate(binding="src", whole=Range("a", "0", 0, 4_000), first=Poison("whole"), call=gate,
                    max_calls=10_000, workers=4)
    assert gate.most_running == 4
    assert gate.ended != gate.started  # some call ended before one started earlier
    assert [f.offset for f in found.failing] == sorted(poison) and all(f.isolated for f in found.failing)
    assert found.outputs()["out"]["o"].to_pylist() == [o for o in range(4_000) if o not in poison]
    assert found.calls == _sequential_halving_calls(0, 4_000, poison)


def test_a_wide_first_split_then_halves() -> None:
    """first_split=16 on 1,000 offsets with one poison: 16 calls, then halves of the one failing
    sixteenth ([500, 562): 5 halvings down to 500, 2 calls each); a budget below 16 narrows the first split
    to what it allows."""
    calls: list[tuple[int, int]] = []
    inner = _poisoned_call({500})

    def call(start: int, end: int):
        calls.append((start, end))
        return inner(start, end)

    found = isolate(binding="src", whole=Range("a", "0", 0, 1_000), first=Poison("whole"), call=call,
                    max_calls=1_000, first_split=16, workers=1)
    assert calls[:16] == [(i * 1_000 // 16, (i + 1) * 1_000 // 16) for i in range(16)]
    assert [f.offset for f in found.failing] == [500]
    assert found.calls == 16 + _sequential_halving_calls(500, 562, {500}) == 16 + 2 * 5
    calls.clear()
    found = isolate(binding="src", whole=Range("a", "0", 0, 1_000), first=Poison("whole"), call=call,
                    max_calls=5, first_split=16, workers=1)
    assert len(calls[0:5]) == found.calls == 5 and calls[0] == (0, 200)  # five fifths
    assert [f.offset for f in found.failing if not f.isolated] == list(range(400, 600))
    with pytest.raises(ValueError, match="first_split >= 2"):
        isolate(binding="src", whole=Range("a", "0", 0, 10), first=Poison("whole"), call=call,
                max_calls=10, first_split=1)


@pytest.mark.parametrize("where", ["platform", "after_call"])
def test_a_failure_stops_isolation_after_every_call_in_flight_has_ended(where: str) -> None:
    """A platform failure of one call (or a crash in ``after_call``) propagates from ``isolate``;
    when it does, no call is running and no worker thread is left; calls not yet started never
    start."""
    poison = {i * 100 + 3 for i in range(10)}
    inner = _poisoned_call(poison)
    lock = threading.Lock()
    running: list[int] = [0]
    started: list[tuple[int, int]] = []

    def call(start: int, end: int):
        with lock:
            running[0] += 1
            started.append((start, end))
        try:
            if where == "platform" and (start, end) == (250, 500):
                raise StepFailure(OSError("data file vanished"), Phase.READ)
            return inner(start, end)
        finally:
            with lock:
                running[0] -= 1

    seen = [0]

    def after_call() -> None:
        seen[0] += 1
        if where == "after_call" and seen[0] == 5:
            raise SimulatedCrash("after_isolation_call")

    assert origin_of(OSError("x"), phase=Phase.READ) is Origin.PLATFORM
    with pytest.raises(StepFailure if where == "platform" else SimulatedCrash) as info:
        isolate(binding="src", whole=Range("a", "0", 0, 1_000), first=Poison("whole"), call=call,
                max_calls=1_000, workers=4, after_call=after_call)
    assert running[0] == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("cues-isolate")]
    after = len(started)
    assert after < _sequential_halving_calls(0, 1_000, poison)  # it stopped early
    if where == "platform":
        assert isinstance(info.value.cause, OSError) and seen[0] == 3  # the calls before it in order
    assert len(started) == after  # nothing started once isolate had raised


def test_the_default_budget_is_32_calls_per_halving_of_the_step() -> None:
    """``max_isolation_calls=None``: 32·⌈log2 n⌉ (640 for 1M offsets, room for about 16 failing
    rows at 2·log2(n/k) calls each); a number given is taken as it is."""
    assert call_budget(None, 1_000_000) == 640 and call_budget(None, 10_000) == 448
    assert call_budget(None, 1) == 32 and call_budget(0, 1_000_000) == 0 and call_budget(7, 2) == 7
    need = 2 * 16 * math.ceil(math.log2(1_000_000 / 16))
    assert need <= call_budget(None, 1_000_000)


def test_isolation_workers_1_calls_the_function_one_at_a_time_and_finds_the_same_rows(spark, lake) -> None:
    """``Options(isolation_workers=1)``: for a function that cannot be called from two threads at
    once; the rows found are those of the default (4 threads)."""
    import threading

    poison = {3, 500, 997}
    active, most = [0], [0]
    lock = threading.Lock()

    def fn(ctx, src):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            ids = set(src.select("id").toArrow()["id"].to_pylist())
            if ids & poison:
                raise Poison(f"poison ids {sorted(ids & poison)}")
            return src
        finally:
            with lock:
                active[0] -= 1

    runner = GraphRunner(graph=_graph(fn, isolation_workers=1), lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 1_000), partition="0")
    runner.run_until_idle()
    assert most[0] == 1
    assert _ids(lake, "b") == [i for i in range(1_000) if i not in poison]
    assert sorted(json.loads(e["inputs"])["src"][2] for e in _errors(lake)) == sorted(poison)


def test_isolation_workers_below_1_is_refused_when_the_graph_is_built() -> None:
    from cues_platform.processing.errors import GraphError

    with pytest.raises(GraphError, match="isolation_workers must be >= 1"):
        _graph(lambda ctx, src: src, isolation_workers=0)
