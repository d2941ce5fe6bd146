"""Isolation (issue 27): one bad row costs one row, exactly once (processing/isolation.py)."""

from __future__ import annotations

import json
import math

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
from cues_platform.processing.errors import PlatformStepError
from cues_platform.processing.failures import Phase, StepFailure
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

    def fn(ctx, src):
        calls.append(ctx.inputs["src"])
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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(min_value=1, max_value=300), data=st.data())
def test_isolate_partitions_the_range_and_names_only_proven_rows(n, data) -> None:
    """Without Spark: the halves that succeed and the failing offsets partition [0, n) exactly;
    an offset is failing (isolated) only if a call on it alone failed; calls stay within budget."""
    poison = data.draw(st.sets(st.integers(min_value=0, max_value=n - 1), min_size=1, max_size=8))
    budget = data.draw(st.integers(min_value=0, max_value=400))
    alone_failed: set[int] = set()

    def call(start: int, end: int) -> dict[str, pa.Table]:
        bad = [o for o in range(start, end) if o in poison]
        if bad:
            if end - start == 1:
                alone_failed.add(start)
            raise StepFailure(Poison(str(bad)), Phase.FUNCTION)
        return {"out": pa.table({"o": list(range(start, end))})}

    found = isolate(binding="src", whole=Range("a", "0", 0, n), first=Poison("whole"), call=call,
                    max_calls=budget)
    delivered = found.outputs()["out"]["o"].to_pylist() if found.good else []
    failing = [f.offset for f in found.failing]
    assert delivered == sorted(delivered)  # offset order
    assert sorted(delivered + failing) == list(range(n))
    assert found.calls <= budget
    isolated = {f.offset for f in found.failing if f.isolated}
    assert isolated <= alone_failed | ({0} if n == 1 else set())
    assert poison <= set(failing)
    if budget >= 2 * len(poison) * max(1, math.ceil(math.log2(n))):
        assert set(failing) == poison and all(isinstance(f, Failing) and f.isolated for f in found.failing)


def test_the_default_budget_is_32_calls_per_halving_of_the_step() -> None:
    """``max_isolation_calls=None``: 32·⌈log2 n⌉ (640 for 1M offsets, room for about 16 failing
    rows at 2·log2(n/k) calls each); a number given is taken as it is."""
    assert call_budget(None, 1_000_000) == 640 and call_budget(None, 10_000) == 448
    assert call_budget(None, 1) == 32 and call_budget(0, 1_000_000) == 0 and call_budget(7, 2) == 7
    need = 2 * 16 * math.ceil(math.log2(1_000_000 / 16))
    assert need <= call_budget(None, 1_000_000)
