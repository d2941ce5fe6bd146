"""``OutputWriter.EXECUTORS``: Spark's executors write a step's output files and the driver
commits them by reference. Every test compares with what the driver path delivers and checks
where the committed files came from (Spark's folders ``_partition=0/step-*`` vs delta-rs')."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import functions as F

from cues_platform.audit import audit
from cues_platform.processing import GraphRunner, OutputWriter, SimulatedCrash, Strategy
from cues_platform.processing.executor_output import write_by_executors
from cues_platform.queues import OffsetLayout
from cues_platform.queues.based import absolute
from cues_platform.queues.errors import BatchError
from cues_platform.queues.schema import DELIVERY_HASH, OFFSET
from cues_platform.queues.spark_values import step_constant
from tests.processing.graphs import PID, CrashAt, build_graph, ids_of, load_inputs
from tests.support import generated_code, rows

N = 30


LAYOUTS = pytest.mark.parametrize("layout", [OffsetLayout.ABSOLUTE, OffsetLayout.BASED])


def with_writer(graph, writer: OutputWriter, layout: OffsetLayout = OffsetLayout.ABSOLUTE):
    """``graph`` with ``writer`` and its queues created with ``layout`` (the error queue too)."""
    proc = graph.processors[PID]
    proc = replace(proc, options=replace(proc.options, output_writer=writer))
    queues = [replace(q, offset_layout=layout) for q in graph.queues.values()]
    return type(graph).build(name=graph.name, queues=queues, processors=[proc],
                             error_queue=graph.error_queue)


def spark_written(lake, queue: str) -> list[bool]:
    """Per committed file of ``queue``: was it written by the executors?"""
    return [f.path.split("/")[1].startswith("step-") for f in lake.queue(queue).files()]


def committed(lake, queue: str):
    """The queue's rows read by delta-rs, offsets made absolute (``_base + _offset``)."""
    return absolute(lake.queue(queue).table.to_pyarrow_table()).sort_by(OFFSET)


@LAYOUTS
@pytest.mark.parametrize("strategy", [Strategy.EXACTLY_ONCE, Strategy.AT_LEAST_ONCE])
def test_executors_write_what_the_driver_would_with_dense_offsets(spark, lake, strategy, layout) -> None:
    graph = with_writer(build_graph("map", strategy=strategy), OutputWriter.EXECUTORS, layout)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "map", N)
    stats = runner.run_until_idle()[PID]
    assert ids_of(lake, "b") == [2 * i for i in range(N)]
    table = committed(lake, "b")
    assert table[OFFSET].to_pylist() == list(range(N))  # dense, from 0, no repeat
    hashes = [r.delivery_hash for r in stats.results]
    assert len(hashes) == 3 and set(table[DELIVERY_HASH].to_pylist()) == set(hashes)
    assert spark_written(lake, "b") and all(spark_written(lake, "b"))
    if strategy is Strategy.EXACTLY_ONCE:
        report = audit(lake)
        assert report.ok, report.violations


@LAYOUTS
def test_a_writer_appending_between_write_and_commit_gets_its_offsets_and_the_step_is_committed_after_it(
        spark, lake, layout) -> None:
    """Absolute offsets: the files carry offsets another writer took, so the step's rows are
    appended again with new ones (one commit, no gap, no repeat) and the files are left out of
    the snapshot. Based offsets: the same files are committed with bases after the intruder's
    row (no rewrite)."""
    graph = with_writer(build_graph("map"), OutputWriter.EXECUTORS, layout)
    intruded = []

    def intrude(point: str) -> None:
        if point == "after_prepare" and not intruded:
            intruded.append(lake.queue("b").append(rows(1000, 1), partition="0"))

    runner = GraphRunner(graph=graph, lake=lake, spark=spark, hook=intrude)
    load_inputs(lake, "map", N)
    runner.run_until_idle()
    table = committed(lake, "b")
    assert table[OFFSET].to_pylist() == list(range(N + 1))
    assert sorted(table["id"].to_pylist()) == sorted([1000] + [2 * i for i in range(N)])
    assert intruded[0].first_offset == 0
    # absolute: the intruder's file and the rewritten step; based: the intruder's file only
    assert spark_written(lake, "b").count(False) == (1 if layout is OffsetLayout.BASED else 2)
    report = audit(lake)  # only the intruder's row is outside the protocol; no step is doubled
    assert [(v.kind, v.queue, v.offsets) for v in report.violations] == [("no_delivery_hash", "b", (0, 1))]


@LAYOUTS
def test_a_crash_after_the_executors_wrote_delivers_once(spark, lake, layout) -> None:
    graph = with_writer(build_graph("map"), OutputWriter.EXECUTORS, layout)
    load_inputs_runner = GraphRunner(graph=graph, lake=lake, spark=spark,
                                     hook=CrashAt("after_prepare", 2))
    load_inputs(lake, "map", N)
    with pytest.raises(SimulatedCrash):
        load_inputs_runner.run_until_idle()
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert ids_of(lake, "b") == [2 * i for i in range(N)]
    assert committed(lake, "b")[OFFSET].to_pylist() == list(range(N))
    report = audit(lake)
    assert report.ok, report.violations


def test_other_column_types_fall_back_to_the_driver_which_converts_them(spark, lake) -> None:
    """int32 ids are not the queue's int64: the executors do not write; the driver converts."""
    def fn(ctx, src):
        return src.select((F.col("id") * 2).cast("int").alias("id"), F.col("note"))

    graph = with_writer(build_graph("map", fn=fn), OutputWriter.EXECUTORS)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "map", N)
    runner.run_until_idle()
    assert ids_of(lake, "b") == [2 * i for i in range(N)]
    assert not any(spark_written(lake, "b"))


@LAYOUTS
@pytest.mark.parametrize("writer", [OutputWriter.EXECUTORS, OutputWriter.DRIVER])
def test_nulls_in_a_required_column_are_the_same_contract_break_either_way(spark, lake, writer, layout) -> None:
    def fn(ctx, src):
        return src.select(F.when(F.col("id") == 13, None).otherwise(F.col("id")).alias("id"),
                          F.col("note"))

    graph = with_writer(build_graph("map", fn=fn), writer, layout)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "map", N)
    runner.run_until_idle()
    errors = lake.queue("errors").table.to_pyarrow_table()
    assert errors.num_rows == 1
    assert "NullValueError" in errors["exception_type"][0].as_py()
    assert "'id'" in errors["message"][0].as_py()
    assert ids_of(lake, "b") == list(range(10)) + list(range(20, 30))
    assert pc.all(pc.is_valid(committed(lake, "b")["id"])).as_py()
    assert audit(lake).ok


def test_auto_writes_small_steps_on_the_driver(spark, lake) -> None:
    graph = build_graph("map")
    assert graph.processors[PID].options.output_writer is OutputWriter.AUTO
    GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "map", N)
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert ids_of(lake, "b") == [2 * i for i in range(N)]
    assert not any(spark_written(lake, "b"))


@LAYOUTS
def test_a_step_over_the_queues_batch_limit_is_refused_on_the_executors_path_too(spark, lake, layout) -> None:
    """The executors count the rows they wrote; over the queue's ``max_batch_rows`` the step is
    refused with the driver path's error (one check, ``schema.check_batch_rows``), nothing
    committed."""
    q = lake.create_queue("small", schema=pa.schema([pa.field("id", pa.int64())]), max_batch_rows=5,
                          offset_layout=layout)
    frame = spark.range(10).select(F.col("id").cast("long").alias("id"))
    with pytest.raises(BatchError) as err:
        write_by_executors(frame, q, partition="0", delivery_hash="ab" * 32)
    assert (err.value.queue, err.value.rows, err.value.limit) == ("small", 10, 5)
    assert "more than the queue's limit of 5; split it or raise max_batch_rows" in str(err.value)
    assert q.next_offset("0") == 0 and q.count() == 0


def test_the_append_time_is_data_not_code_so_every_step_reuses_the_compiled_stage(spark) -> None:
    """Spark keeps compiled stages by their source; a long literal is written into the source. Two
    steps' append times through ``step_constant`` give the same source (and each row its own
    step's value); the same times as plain literals give two sources (the recompile it avoids)."""
    first, second = 1_795_948_494_676_000, 1_795_948_555_123_456
    frame = spark.range(4)

    def stamped(column):
        return frame.select("id", F.timestamp_micros(column).alias("t"))

    ours = [stamped(step_constant(v)) for v in (first, second)]
    literals = [stamped(F.lit(v)) for v in (first, second)]
    assert generated_code(ours[0]) == generated_code(ours[1])
    assert generated_code(literals[0]) != generated_code(literals[1])
    for frame_, micros in zip(ours, (first, second), strict=True):
        got = frame_.select(F.unix_micros("t").alias("m")).toArrow()["m"].to_pylist()
        assert got == [micros] * 4
