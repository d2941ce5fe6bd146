"""Range reads through Arrow and Spark, pruned by per-file offset statistics."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from cues_platform.queues import OffsetRangeError, parallel_files
from cues_platform.queues.reader import PRUNING_MIN_ROWS, plan_read
from tests.support import generated_code, rows, spark_explained


@pytest.fixture
def filled(make_queue):
    q = make_queue(partitions=("a", "b"))
    for i in range(5):
        q.append(rows(i * 10, 10), partition="a")
    q.append(rows(100, 7), partition="b")
    return q


def test_plan_prunes_files_by_offset_statistics(filled) -> None:
    plan = plan_read(filled, partition="a", start=12, end=25)
    assert [
        (f.min_offset, f.max_offset) for f in sorted(plan.files, key=lambda f: f.min_offset)
    ] == [(10, 19), (20, 29)]
    assert plan_read(filled, partition="b", start=0, end=None).end == 7


def test_arrow_range_read(filled) -> None:
    table = filled.read_arrow(partition="a", start=12, end=25)
    assert table["_offset"].to_pylist() == list(range(12, 25))
    assert table["id"].to_pylist() == list(range(12, 25))
    assert set(table["_partition"].to_pylist()) == {"a"}
    assert table.schema.equals(filled.table_schema)


def test_end_past_the_last_offset_is_clamped(filled) -> None:
    assert filled.read_arrow(partition="b", start=5, end=1000)["_offset"].to_pylist() == [5, 6]
    assert filled.read_arrow(partition="b", start=7).num_rows == 0


def test_invalid_range_is_refused(filled) -> None:
    with pytest.raises(OffsetRangeError):
        filled.read_arrow(partition="a", start=-1)
    with pytest.raises(OffsetRangeError):
        filled.read_arrow(partition="a", start=5, end=2)


def test_spark_reads_the_same_rows_as_arrow(filled, spark) -> None:
    frame = filled.read_spark(spark, partition="a", start=12, end=25)
    got = sorted((r["_offset"], r["id"], r["_partition"]) for r in frame.collect())
    assert got == [(o, o, "a") for o in range(12, 25)]
    assert frame.columns == filled.table_schema.names


def test_spark_read_of_an_empty_range_has_the_schema(filled, spark) -> None:
    frame = filled.read_spark(spark, partition="b", start=7, end=10)
    assert frame.count() == 0 and frame.columns == filled.table_schema.names


def test_spark_reads_payload_columns_whose_names_need_quoting(lake, spark) -> None:
    """The read is built as Spark SQL text (queues/reader.py): names with a space, a backtick, a
    dot or a keyword come back as they are, with their values, and the partition is a literal."""
    import pyarrow as pa

    odd = ["amount usd", "we`ird", "a.b", "select"]
    q = lake.create_queue("odd", schema=pa.schema([pa.field(n, pa.int64()) for n in odd]),
                          partitions=["p-1.x"])
    q.append(pa.table({n: [i * 10 + k for k in range(4)] for i, n in enumerate(odd)}), partition="p-1.x")
    frame = q.read_spark(spark, partition="p-1.x", start=1, end=3)
    assert frame.columns == q.table_schema.names
    got = sorted(tuple(r[n] for n in [*odd, "_offset", "_partition"]) for r in frame.collect())
    assert got == [(k, 10 + k, 20 + k, 30 + k, k, "p-1.x") for k in (1, 2)]
    assert frame.schema["_partition"].nullable is False


@pytest.mark.parametrize(("start", "end", "whole"), [
    (10, 30, True), (0, 50, True), (12, 25, False), (10, 29, False), (11, 30, False), (40, 45, False)])
def test_a_read_skips_the_offset_filter_only_when_every_file_lies_inside_the_range(
        filled, spark, start, end, whole) -> None:
    plan = plan_read(filled, partition="a", start=start, end=end)
    assert plan.whole_files is whole
    want = list(range(start, min(end, 50)))
    assert filled.read_arrow(partition="a", start=start, end=end)["_offset"].to_pylist() == want
    frame = filled.read_spark(spark, partition="a", start=start, end=end)
    assert sorted(r["_offset"] for r in frame.collect()) == want


def test_partial_reads_of_two_steps_compile_the_same_stage_and_read_their_own_rows(filled, spark) -> None:
    """Bounds as data (spark_values.py): two steps' partial ranges over small files give the
    same generated code; plain literal bounds would give two (the recompile it avoids)."""
    frames = []
    for start, end in [(12, 25), (13, 37)]:
        plan = plan_read(filled, partition="a", start=start, end=end)
        assert not plan.whole_files and not plan.pruning_pays
        frame = filled.read_spark(spark, partition="a", start=start, end=end)
        assert sorted(r["_offset"] for r in frame.collect()) == list(range(start, end))
        frames.append(frame)
    assert generated_code(frames[0]) == generated_code(frames[1])
    literal = [frames[0].where(f"_offset >= {v}") for v in (1, 2)]
    assert generated_code(literal[0]) != generated_code(literal[1])


def test_a_small_range_of_a_big_file_keeps_literal_bounds_the_parquet_reader_prunes_by(
        make_queue, spark, monkeypatch) -> None:
    q = make_queue("big")
    # one big file, as delta-rs' writer or a compaction writes it (a big append is cut into a
    # file per core otherwise: queues/parallel_files.py)
    monkeypatch.setattr(parallel_files, "PARALLEL_MIN_ROWS", 2**62)
    q.append(rows(0, PRUNING_MIN_ROWS + 100), partition="0")
    assert len(plan_read(q, partition="0", start=0, end=1).files) == 1
    plan = plan_read(q, partition="0", start=500, end=510)
    assert plan.pruning_pays
    frame = q.read_spark(spark, partition="0", start=500, end=510)
    assert sorted(r["_offset"] for r in frame.collect()) == list(range(500, 510))
    pushed = spark_explained(frame, "formatted")
    assert "GreaterThanOrEqual(_offset,500)" in pushed and "LessThan(_offset,510)" in pushed
    # fewer rows outside the range than PRUNING_MIN_ROWS: bounds as data, nothing pushed down
    wide = q.read_spark(spark, partition="0", start=100, end=PRUNING_MIN_ROWS)
    assert not plan_read(q, partition="0", start=100, end=PRUNING_MIN_ROWS).pruning_pays
    assert "GreaterThanOrEqual(_offset" not in spark_explained(wide, "formatted")
    assert wide.count() == PRUNING_MIN_ROWS - 100


def test_a_functions_filter_on_a_partial_read_still_reaches_the_parquet_reader(filled, spark) -> None:
    """The bounds as data stay deterministic (zero times ``_offset``), so Spark still pushes a
    filter the function adds on a payload column down to the Parquet reader (it pushes no
    filter through a non-deterministic one)."""
    frame = filled.read_spark(spark, partition="a", start=12, end=25).where("id > 20")
    assert "GreaterThan(id,20)" in spark_explained(frame, "formatted")
    assert sorted(r["id"] for r in frame.collect()) == list(range(21, 25))


def test_threads_reading_their_own_ranges_through_one_compiled_stage_each_get_their_rows(filled, spark) -> None:
    """Lanes step concurrently on one Spark session (processing/lanes.py): with the bounds as data
    their reads share one compiled class, each with its own values, on one queue handle."""
    ranges = [(11 + i, 24 + 2 * i) for i in range(8)]

    def read(bounds: tuple[int, int]) -> list[int]:
        frame = filled.read_spark(spark, partition="a", start=bounds[0], end=bounds[1])
        return sorted(r["_offset"] for r in frame.collect())

    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(read, ranges * 3))
    assert got == [list(range(s, e)) for s, e in ranges * 3]
