"""Who failed? Only the user's own exceptions (and contract breaks) become error rows; a platform
failure stops the processor, writes nothing and is retried with the same snapshot and hash."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from cues_platform.processing import BackingQueue, GraphRunner, Strategy
from cues_platform.processing.errors import PlatformStepError
from cues_platform.processing.failures import Origin, origin_of_exception_type
from cues_platform.processing.home import read_home
from cues_platform.queues import Lake
from tests.processing.graphs import PID, build_graph, check_exact, ids_of, load_inputs
from tests.support import ROOT


class UdfBoom(ValueError):
    """Raised by a UDF on an executor."""


def data_files(lake: Lake, queue: str) -> list[Path]:
    root = lake.local_path(lake.queue(queue).uri)
    return sorted(p for p in root.rglob("*.parquet") if "_delta_log" not in p.parts)


def error_rows(lake: Lake) -> list[dict]:
    return lake.queue("errors").read_arrow(partition="0").to_pylist()


class MoveAway:
    """A hook that moves a queue's data files away at ``point`` (once), to restore them later."""

    def __init__(self, lake: Lake, queue: str, point: str, where: Path) -> None:
        self.lake, self.queue, self.point, self.where = lake, queue, point, where
        self.moved: list[tuple[Path, Path]] = []

    def __call__(self, point: str) -> None:
        if point == self.point and not self.moved:
            self.where.mkdir(parents=True, exist_ok=True)
            for f in data_files(self.lake, self.queue):
                dst = self.where / f.name
                shutil.move(f, dst)
                self.moved.append((f, dst))

    def restore(self) -> None:
        for src, dst in self.moved:
            shutil.move(dst, src)


@pytest.mark.parametrize("point", ["before_snapshot", "after_read"])
@pytest.mark.parametrize("strategy", [Strategy.EXACTLY_ONCE, Strategy.AT_LEAST_ONCE])
def test_missing_input_file_is_a_platform_failure_retried_with_the_same_hash(spark, lake, tmp_path,
                                                                              strategy, point):
    """The input Parquet file vanishes for one step (before the frames are opened, or after: Spark
    is lazy, so then the read fails while the result is materialized), then comes back: no error
    row, the step is not delivered, and the restart delivers it with the same delivery hash."""
    graph = build_graph("map", strategy=strategy)
    hook = MoveAway(lake, "a", point, tmp_path / "away")
    runner = GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook)
    load_inputs(lake, "map")
    with pytest.raises(PlatformStepError) as info:
        runner.run_until_idle()
    assert hook.moved
    failed = info.value
    assert failed.retryable and failed.processor == PID and failed.step == 0
    assert failed.phase == ("read" if point == "before_snapshot" else "materialize")
    if point == "after_read":  # Spark could not convert the Java error: Py4J's, never the user's
        assert origin_of_exception_type(failed.cause_type) is Origin.PLATFORM, failed.cause_type
    assert error_rows(lake) == [] and ids_of(lake, "b") == []
    if strategy is Strategy.EXACTLY_ONCE:  # nothing recorded: the restart plans from position 0
        assert BackingQueue(lake, PID).last_record() is None
        assert read_home(lake.queue("b"), graph.processors[PID]).step == -1
    hook.restore()
    stats = GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    first = stats[PID].results[0]
    assert first.step == 0 and first.delivery_hash == failed.delivery_hash and first.outcome == "output"
    assert ids_of(lake, "b") == [i * 2 for i in range(30)] and error_rows(lake) == []
    if strategy is Strategy.EXACTLY_ONCE:
        check_exact(lake, "map", "output")


def test_a_udf_that_raises_is_the_users_error_row_named_after_its_class(spark, lake):
    """A UDF fails on an executor while the result is materialized: that is the user's logic, so
    one error row per failing row (isolation), whose exception_type is the user's class (not
    pyspark's PythonException)."""

    @F.udf(LongType())
    def check(i):
        if 10 <= i < 20:
            raise UdfBoom(f"id {i} is not allowed")
        return i * 2

    def fn(ctx, src):
        return src.select(check(F.col("id")).alias("id"), F.col("note"))

    graph = build_graph("map", fn=fn)
    load = GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "map")
    load.run_until_idle()
    errors = sorted(error_rows(lake), key=lambda e: json.loads(e["inputs"])["src"][2])
    assert len(errors) == 10
    for offset, error in zip(range(10, 20), errors, strict=True):
        assert error["exception_type"] == f"{__name__}.UdfBoom"
        assert origin_of_exception_type(error["exception_type"]) is Origin.USER
        assert f"id {offset} is not allowed" in error["message"]
        assert json.loads(error["inputs"]) == {"src": ["a", "0", offset, offset + 1]}
    assert ids_of(lake, "b") == [i * 2 for i in range(30) if not 10 <= i < 20]


def test_ansi_arithmetic_error_on_the_executors_is_the_users(spark, lake):
    """Spark's ANSI runtime errors (here a division by zero) are the user's plan failing."""

    def fn(ctx, src):
        divisor = F.when(F.col("id") == 15, F.lit(0)).otherwise(F.lit(1))
        return src.select((F.col("id") * 2 + (F.col("id") % divisor) * 0).alias("id"), F.col("note"))

    spark.conf.set("spark.sql.ansi.enabled", "true")
    try:
        graph = build_graph("map", fn=fn)
        runner = GraphRunner(graph=graph, lake=lake, spark=spark)
        load_inputs(lake, "map")
        runner.run_until_idle()
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")
    errors = error_rows(lake)
    assert len(errors) == 1, errors  # the one row dividing by zero, isolated
    assert origin_of_exception_type(errors[0]["exception_type"]) is Origin.USER
    assert "ArithmeticException" in errors[0]["exception_type"]
    assert json.loads(errors[0]["inputs"]) == {"src": ["a", "0", 15, 16]}
    assert ids_of(lake, "b") == [i * 2 for i in range(30) if i != 15]


def test_an_oserror_the_function_raises_itself_is_the_users(spark, lake):
    def fn(ctx, src):
        if ctx.inputs["src"].start == 10:
            with open(os.path.join(ctx.lake.root, "no-such-file.csv")) as f:  # noqa: PTH123
                f.read()
        return src.select((F.col("id") * 2).alias("id"), F.col("note"))

    graph = build_graph("map", fn=fn)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "map")
    runner.run_until_idle()
    errors = error_rows(lake)
    assert [e["exception_type"] for e in errors] == ["builtins.FileNotFoundError"]
    # the function fails on every call whose range starts at offset 10: isolation proves only
    # offset 10 failing (calls on [10, 11) fail, on [11, 12), [12, 15), [15, 20) succeed)
    assert json.loads(errors[0]["inputs"]) == {"src": ["a", "0", 10, 11]}
    assert ids_of(lake, "b") == [i * 2 for i in range(30) if i != 10]


KILL_JVM_CHILD = """
import sys
from cues_platform.processing import GraphRunner
from cues_platform.processing.errors import PlatformStepError
from cues_platform.queues import Lake
from tests.processing.graphs import build_graph, load_inputs

root = sys.argv[1]
lake = Lake(root=root)
runner = None

def hook(point, seen=[]):
    seen.append(point)
    if point == "after_read" and seen.count("after_read") == 2:
        proc = runner.steppers["p"].spark.sparkContext._gateway.proc
        proc.kill()  # Spark's JVM dies in the middle of step 1
        proc.wait()

runner = GraphRunner(graph=build_graph("fork"), lake=lake, hook=hook)
load_inputs(lake, "fork")
try:
    runner.run_until_idle()
except PlatformStepError as exc:
    print("PLATFORM", exc.step, exc.phase, exc.cause_type, flush=True)
    sys.exit(0)
print("NO PLATFORM ERROR", flush=True)
sys.exit(1)
"""


def test_spark_jvm_dying_mid_step_is_a_platform_failure(spark, tmp_path):
    """Spark's JVM is killed after step 1 opened its frames: the step fails in Py4J, writes no error
    row, and a restart with a live Spark delivers every row exactly once."""
    root = tmp_path / "lake"
    proc = subprocess.run([sys.executable, "-c", KILL_JVM_CHILD, str(root)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PLATFORM"))
    assert line.split()[1] == "1"
    # The function's first Spark call finds the JVM gone: py4j raises ConnectionRefusedError (an
    # OSError from inside py4j, so not the user's own) or a Py4JError.
    _, _, phase, cause = line.split()
    assert phase == "function"
    assert cause.startswith("py4j.") or cause == "builtins.ConnectionRefusedError", cause
    lake = Lake(root=str(root))
    assert lake.queue("errors").read_arrow(partition="0").num_rows == 0
    last = BackingQueue(lake, PID).last_record()  # step 1 recorded nothing: step 0 is the last
    assert last.is_attempt and last.step == 0
    assert read_home(lake.queue("b"), build_graph("fork").processors[PID]).step == 0
    GraphRunner(graph=build_graph("fork"), lake=lake, spark=spark).run_until_idle()
    check_exact(lake, "fork", "output")


def test_a_pyspark_client_error_while_materializing_is_the_platforms_not_the_users():
    """pyspark's own Python-side refusal (here Spark Connect's writer refusing a save mode) raised
    while the platform writes the step is a platform failure; the same error raised inside the
    user's function (the user misused pyspark) stays the user's; a UDF's error converted from the
    executors stays the user's in both phases."""
    from pyspark.errors import PySparkValueError
    from pyspark.errors.exceptions.connect import PythonException

    from cues_platform.processing.failures import Phase, origin_of

    refused = PySparkValueError(errorClass="UNSUPPORTED_OPERATION",
                                messageParameters={"operation": "errorifexists"})
    assert origin_of(refused, phase=Phase.MATERIALIZE) is Origin.PLATFORM
    assert origin_of(refused, phase=Phase.FUNCTION) is Origin.USER
    udf_raised = PythonException(message="ValueError: bad row")  # as Spark Connect converts it
    assert origin_of(udf_raised, phase=Phase.MATERIALIZE) is Origin.USER
