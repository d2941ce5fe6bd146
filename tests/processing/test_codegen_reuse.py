"""A processor's steps compile Spark code once: a step that differs from the one before only in its
ranges, hash and append time runs the stages Spark already compiled (``queues/spark_values.py``).
Counted with Spark's own codegen metric (classic session) between step commits."""

from __future__ import annotations

import pytest

from cues_platform.processing import GraphRunner, OutputWriter
from cues_platform.processing.inputs import rows_between
from cues_platform.queues import OffsetLayout
from cues_platform.queues.reader import ReadPlan
from tests.processing.graphs import build_graph
from tests.support import generated_code, rows

STEPS_TO_WARM = 3  # the first steps compile: a read inside one file, one across two, the write


def compilations_per_step(spark, lake, graph) -> list[int]:  # noqa: ANN001
    """Run ``graph`` over 6 appends of 10 rows in steps of 7 (every step's range partial)."""
    metric = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    counts: list[int] = []

    def hook(point: str) -> None:
        if point == "after_commit":
            counts.append(metric.getCount())

    runner = GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook)
    for i in range(6):
        lake.queue("a").append(rows(i * 10, 10), partition="0")
    runner.run_until_idle()
    assert lake.queue("b").count() == 60
    return [b - a for a, b in zip(counts, counts[1:], strict=False)]


@pytest.mark.parametrize(("writer", "layout"), [(OutputWriter.DRIVER, OffsetLayout.ABSOLUTE),
                                                (OutputWriter.EXECUTORS, OffsetLayout.BASED)])
def test_steps_after_the_first_compile_nothing(spark, lake, writer, layout) -> None:  # noqa: ANN001
    graph = build_graph("map", batch=7, writer=writer, offset_layout=layout)
    per_step = compilations_per_step(spark, lake, graph)
    assert len(per_step) == 8 and sum(per_step[STEPS_TO_WARM:]) == 0, per_step


def test_literal_bounds_would_compile_every_step(spark, lake, monkeypatch) -> None:  # noqa: ANN001
    """The control: the same steps with the range as literals (what a read whose pruning pays
    does) compile again each step, so the count above can see a recompile."""
    monkeypatch.setattr(ReadPlan, "pruning_pays", property(lambda plan: True))
    per_step = compilations_per_step(spark, lake, build_graph("map", batch=7))
    assert all(n > 0 for n in per_step[STEPS_TO_WARM:]), per_step


def test_the_halves_isolation_reads_share_one_compiled_stage(spark, tmp_path) -> None:  # noqa: ANN001
    """Isolation narrows a failing step's input to halves, quarters, ... (``rows_between``): each
    sub-range is the same code, and holds exactly its rows. The input is read from files, as a
    step's is (Spark reads every file column as nullable; ``spark_values.py`` says why that
    matters)."""
    spark.range(100).withColumnRenamed("id", "_offset").write.parquet(str(tmp_path / "input"))
    frame = spark.read.parquet(str(tmp_path / "input"))
    halves = [rows_between(frame, a, b) for a, b in [(0, 50), (50, 100), (25, 38)]]
    assert len({generated_code(h) for h in halves}) == 1
    assert [sorted(r["_offset"] for r in h.collect()) for h in halves] == [
        list(range(0, 50)), list(range(50, 100)), list(range(25, 38))]
