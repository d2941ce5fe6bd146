"""Queues with based offsets (``OffsetLayout.BASED``, queues/based.py): a row's offset is its
file's ``_base`` plus its ``_offset``. Driver appends write base 0 and absolute offsets; files
written as Spark's executors write them (``_offset`` = the row's index in its file) get their base
when committed by reference. Every platform reader returns absolute offsets and no ``_base``."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from cues_platform import clock
from cues_platform.queues import OffsetLayout, OffsetOutOfRangeError
from cues_platform.queues.by_reference import (
    NotCommittableError,
    WrittenPart,
    commit_files,
    read_footer,
    verify_based,
)
from cues_platform.queues.errors import QueueError
from cues_platform.queues.handle import verify_log
from cues_platform.queues.layout import FORMAT_KEY
from cues_platform.queues.maintenance import compact, maintain
from cues_platform.queues.reader import plan_read
from cues_platform.queues.retention import RetentionPolicy, _time_cut, cuts, delete_below
from cues_platform.queues.schema import BASE, METADATA_FIELDS, OFFSET, PARTITION, full_schema
from tests.support import PAYLOAD, rows

FILE_SCHEMA = pa.schema([*PAYLOAD, *(f for f in METADATA_FIELDS if f.name != PARTITION)])
LAYOUTS = [OffsetLayout.ABSOLUTE, OffsetLayout.BASED]
DAY_MS = 86_400_000


@pytest.fixture(autouse=True)
def _real_clock():
    yield
    clock.reset()


# -- helpers -------------------------------------------------------------------------------------
def step_folder(partition: str = "0") -> str:
    return f"_partition={partition}/step-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:12]}"


def write_executor_file(q, folder: str, task: int, ids: list[int], *,
                        offsets: list[int] | None = None,
                        append_times: list[datetime] | None = None) -> str:
    """A file as one Spark task writes it for a based queue: ``_offset`` = the row's index in the
    file (unless ``offsets`` says otherwise), every data-file column, no partition column."""
    n = len(ids)
    offsets = list(range(n)) if offsets is None else offsets
    now = datetime.fromtimestamp(clock.now_ms() / 1000, UTC)
    data = {"id": ids, "note": [f"n{i}" for i in ids], OFFSET: offsets,
            "_producer_id": [None] * n, "_producer_seq": [None] * n,
            "_delivery_hash": ["h"] * n, "_message_type": ["message"] * n,
            "_append_time": append_times or [now] * n, "_txn_id": [None] * n}
    relative = f"{folder}/part-{task:05d}-{uuid.uuid4()}-c000.snappy.parquet"
    path = Path(q.uri.removeprefix("file://")) / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(data, schema=FILE_SCHEMA), path)
    return relative


def executor_step(q, id_groups: list[list[int]], *, partition: str = "0",
                  write_order: list[int] | None = None, **kwargs) -> WrittenPart:
    """One step's files (task i holds ``id_groups[i]``), written in ``write_order`` and verified
    (footers handed over in that order too) from the partition's current next offset."""
    folder = step_folder(partition)
    order = write_order or list(range(len(id_groups)))
    paths = {i: write_executor_file(q, folder, i, id_groups[i], **kwargs) for i in order}
    footers = [read_footer(q, paths[i]) for i in order]
    return verify_based(q, partition, q.next_offset(partition), footers)


def commit_step(q, id_groups: list[list[int]], **kwargs):
    return commit_files(q, {"0": executor_step(q, id_groups, **kwargs)})


def offsets_and_ids(table: pa.Table) -> list[tuple[int, int]]:
    return sorted(zip(table[OFFSET].to_pylist(), table["id"].to_pylist(), strict=True))


def spark_offsets_and_ids(frame) -> list[tuple[int, int]]:
    return sorted((r[OFFSET], r["id"]) for r in frame.collect())


def add_actions_of(q, version: int) -> list[dict]:
    entry = Path(q.uri.removeprefix("file://")) / "_delta_log" / f"{version:020d}.json"
    return [a["add"] for a in map(json.loads, entry.read_text().splitlines()) if "add" in a]


def without_time(table: pa.Table) -> list[dict]:
    return table.drop_columns(["_append_time"]).to_pylist()


@pytest.fixture
def mixed(make_queue):
    """A based queue, partition "0": driver rows at 0..4 (ids 100..104), one step of three based
    files at 5..7, 8..11, 12..13 (ids 200.., 300.., 400..), driver rows at 14..15 (ids 500..).
    ``mixed.want`` maps each offset to its id."""
    q = make_queue("mixed", offset_layout=OffsetLayout.BASED)
    q.append(rows(100, 5), partition="0")
    groups = [[200, 201, 202], [300, 301, 302, 303], [400, 401]]
    # written and handed over out of name order: the bases follow the names (task numbers)
    result = commit_step(q, groups, write_order=[2, 0, 1])
    assert result.ranges == {"0": (5, 14)}
    q.append(rows(500, 2), partition="0")
    ids = [100, 101, 102, 103, 104, *groups[0], *groups[1], *groups[2], 500, 501]
    q.want = dict(enumerate(ids))
    return q


# -- 1. layout of the table, reads of driver appends ---------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_driver_appends_read_back_with_dense_absolute_offsets_and_the_absolute_read_schema(
        make_queue, spark, layout) -> None:
    q = make_queue("q", offset_layout=layout)
    reference = make_queue("reference")  # an absolute queue of the same payload
    for i in range(3):
        q.append(rows(i * 4, 4), partition="0")
    table = q.read_arrow(partition="0")
    assert table[OFFSET].to_pylist() == list(range(12)) and table["id"].to_pylist() == list(range(12))
    assert BASE not in table.column_names
    assert table.schema.equals(reference.read_schema) and q.read_schema.equals(reference.read_schema)
    assert q.read_arrow(partition="0", start=3, end=9)[OFFSET].to_pylist() == list(range(3, 9))
    frame = q.read_spark(spark, partition="0")
    assert frame.columns == reference.read_schema.names
    assert spark_offsets_and_ids(frame) == [(i, i) for i in range(12)]
    assert spark_offsets_and_ids(q.read_spark(spark, partition="0", start=3, end=9)) == [
        (i, i) for i in range(3, 9)]


@pytest.mark.parametrize(("layout", "columns", "version"), [
    (OffsetLayout.ABSOLUTE, [PARTITION], "1"), (OffsetLayout.BASED, [PARTITION, BASE], "2")],
    ids=["absolute", "based"])
def test_the_delta_table_has_the_layouts_partition_columns_and_format(
        make_queue, layout, columns, version) -> None:
    q = make_queue("q", offset_layout=layout)
    metadata = DeltaTable(q.uri).metadata()
    assert metadata.partition_columns == columns
    assert metadata.configuration[FORMAT_KEY] == version
    assert q.offset_layout is layout and q.based is (layout is OffsetLayout.BASED)
    assert (BASE in q.table_schema.names) is q.based and BASE not in q.read_schema.names


def test_driver_appends_to_a_based_queue_write_base_zero_and_absolute_offsets(make_queue) -> None:
    q = make_queue("q", offset_layout=OffsetLayout.BASED)
    q.append(rows(0, 3), partition="0")
    q.append(rows(3, 2), partition="0")
    raw = DeltaTable(q.uri).to_pyarrow_table()
    assert sorted(zip(raw[BASE].to_pylist(), raw[OFFSET].to_pylist(), strict=True)) == [
        (0, i) for i in range(5)]


# -- 2. based files committed by reference ---------------------------------------------------------
def test_based_files_continue_densely_from_the_next_offset_in_file_name_order(mixed) -> None:
    table = mixed.read_arrow(partition="0")
    assert table[OFFSET].to_pylist() == list(range(16))
    assert table["id"].to_pylist() == [mixed.want[o] for o in range(16)]
    assert BASE not in table.column_names
    assert mixed.next_offset("0") == 16


RANGES = [(0, None), (3, 7), (5, 14), (6, 8), (5, 8), (7, 12), (8, 12), (9, 11), (12, 15),
          (13, 14), (4, 5), (14, 16), (10, 100)]


@pytest.mark.parametrize(("start", "end"), RANGES, ids=[f"{s}-{e}" for s, e in RANGES])
def test_range_reads_of_based_files_return_exactly_their_offsets_and_payloads(
        mixed, spark, start, end) -> None:
    want = [(o, mixed.want[o]) for o in range(start, min(16, end or 16))]
    assert offsets_and_ids(mixed.read_arrow(partition="0", start=start, end=end)) == want
    assert mixed.read_arrow(partition="0", start=start, end=end)[OFFSET].to_pylist() == [
        o for o, _ in want]  # in offset order
    frame = mixed.read_spark(spark, partition="0", start=start, end=end)
    assert frame.columns == mixed.read_schema.names
    assert spark_offsets_and_ids(frame) == want


def test_a_read_of_exactly_the_based_files_skips_the_offset_filter_and_is_still_absolute(
        mixed, spark) -> None:
    plan = plan_read(mixed, partition="0", start=5, end=14)
    assert plan.whole_files and {f.base for f in plan.files} == {5, 8, 12}
    want = [(o, mixed.want[o]) for o in range(5, 14)]
    assert spark_offsets_and_ids(mixed.read_spark(spark, partition="0", start=5, end=14)) == want


def test_files_reports_absolute_offsets_and_the_base_of_each_file(mixed) -> None:
    got = sorted((f.min_offset, f.max_offset, f.rows, f.base, f.partition) for f in mixed.files())
    assert got == [(0, 4, 5, 0, "0"), (5, 7, 3, 5, "0"), (8, 11, 4, 8, "0"),
                   (12, 13, 2, 12, "0"), (14, 15, 2, 0, "0")]
    assert [(f.min_offset, f.max_offset) for f in
            sorted(mixed.files(partition="0", start=9, end=13), key=lambda f: f.min_offset)] == [
        (8, 11), (12, 13)]


def test_the_based_files_are_ordered_by_name_and_keep_their_paths(make_queue) -> None:
    q = make_queue("q", offset_layout=OffsetLayout.BASED)
    part = executor_step(q, [[1, 2], [3], [4, 5, 6]], write_order=[1, 2, 0])
    assert [f.path for f in part.files] == sorted(f.path for f in part.files)
    result = commit_files(q, {"0": part})
    adds = add_actions_of(q, result.version)
    assert [(a["path"], a["partitionValues"][BASE]) for a in adds] == [
        (f.path, str(b)) for f, b in zip(part.files, [0, 2, 3], strict=True)]
    assert q.read_arrow(partition="0")["id"].to_pylist() == [1, 2, 3, 4, 5, 6]


# -- 3. another writer between verify and commit -------------------------------------------------
def test_an_append_between_verify_and_commit_moves_the_bases_not_the_files(make_queue) -> None:
    q = make_queue("q", offset_layout=OffsetLayout.BASED)
    q.append(rows(100, 5), partition="0")
    part = executor_step(q, [[200, 201, 202], [300, 301, 302, 303], [400, 401]])
    assert part.start == 5 and part.based
    other = q.lake.queue("q")  # another writer (another handle) takes offsets 5..7
    other.append(rows(500, 3), partition="0")
    result = commit_files(q, {"0": part})
    assert result.ranges == {"0": (8, 17)}
    adds = add_actions_of(q, result.version)
    assert [(a["path"], a["partitionValues"]) for a in adds] == [
        (f.path, {PARTITION: "0", BASE: str(b)}) for f, b in zip(part.files, [8, 11, 15], strict=True)]
    assert all("/step-" in a["path"] for a in adds)  # the step folder's files, not rewritten
    table = q.read_arrow(partition="0")
    assert table[OFFSET].to_pylist() == list(range(17))
    assert table["id"].to_pylist() == [100, 101, 102, 103, 104, 500, 501, 502,
                                       200, 201, 202, 300, 301, 302, 303, 400, 401]
    assert q.next_offset("0") == 17
    assert verify_log(q) == []
    q.append(rows(600, 1), partition="0")  # the appender accepts the log after it
    assert q.read_arrow(partition="0", start=17)["id"].to_pylist() == [600]


# -- 4. refusals -----------------------------------------------------------------------------------
@pytest.mark.parametrize("offsets", [[1, 2, 3], [0, 0, 2], [0, 2, 2], [0, 1, 1], [0, 1, 3]],
                         ids=["from-one", "repeat-first", "repeat-last", "repeat-short", "gap"])
def test_a_file_whose_offsets_are_not_its_row_indexes_is_refused(make_queue, offsets) -> None:
    q = make_queue("q", offset_layout=OffsetLayout.BASED)
    q.append(rows(0, 2), partition="0")
    version = q.version()
    folder = step_folder()
    good = read_footer(q, write_executor_file(q, folder, 0, [10, 11]))
    bad = read_footer(q, write_executor_file(q, folder, 1, [20, 21, 22], offsets=offsets))
    with pytest.raises(NotCommittableError) as info:
        verify_based(q, "0", 2, [good, bad])
    assert info.value.path == bad.path and "rewrite the rows" in str(info.value)
    assert q.version() == version and q.next_offset("0") == 2


def test_a_based_part_is_refused_by_a_queue_with_absolute_offsets(make_queue) -> None:
    q = make_queue("q")
    q.append(rows(0, 2), partition="0")
    version = q.version()
    part = executor_step(q, [[10, 11]])
    with pytest.raises(QueueError, match="absolute offsets"):
        commit_files(q, {"0": part})
    assert q.version() == version and q.next_offset("0") == 2
    assert q.read_arrow(partition="0")["id"].to_pylist() == [0, 1]


# -- 5. retention ----------------------------------------------------------------------------------
@pytest.mark.parametrize("cut", [7, 9, 12, 13, 14, 15], ids=lambda c: f"cut-{c}")
def test_a_delete_through_a_based_file_keeps_the_rows_above_the_cut_at_their_offsets(
        mixed, cut) -> None:
    deleted = delete_below(mixed, {"0": cut})
    assert [(d.old_start, d.new_start, d.rows) for d in deleted] == [(0, cut, cut)]
    assert mixed.start_offset("0") == cut
    table = mixed.read_arrow(partition="0")
    assert offsets_and_ids(table) == [(o, mixed.want[o]) for o in range(cut, 16)]
    assert table[OFFSET].to_pylist() == list(range(cut, 16))
    with pytest.raises(OffsetOutOfRangeError):
        mixed.read_arrow(partition="0", start=cut - 1)
    assert mixed.count() == 16 - cut
    assert min(f.min_offset for f in mixed.files()) == cut


@pytest.mark.parametrize("cut", [7, 9, 12, 13, 15], ids=lambda c: f"cut-{c}")
def test_a_delete_through_a_based_file_leaves_a_log_the_full_check_accepts(mixed, cut) -> None:
    delete_below(mixed, {"0": cut})
    assert verify_log(mixed) == []


@pytest.mark.parametrize("cut", [7, 9, 12, 13, 15], ids=lambda c: f"cut-{c}")
def test_appends_go_on_after_a_delete_through_a_based_file(mixed, cut) -> None:
    delete_below(mixed, {"0": cut})
    mixed.append(rows(900, 1), partition="0")  # the appender's own log check passes
    assert mixed.read_arrow(partition="0", start=16)["id"].to_pylist() == [900]
    commit_step(mixed, [[901, 902]])
    assert mixed.read_arrow(partition="0", start=16)["id"].to_pylist() == [900, 901, 902]


def test_a_spark_read_after_a_delete_through_a_based_file_is_absolute(mixed, spark) -> None:
    delete_below(mixed, {"0": 9})
    want = [(o, mixed.want[o]) for o in range(9, 16)]
    assert spark_offsets_and_ids(mixed.read_spark(spark, partition="0")) == want
    assert spark_offsets_and_ids(mixed.read_spark(spark, partition="0", start=10, end=13)) == [
        (o, mixed.want[o]) for o in range(10, 13)]
    with pytest.raises(OffsetOutOfRangeError):
        mixed.read_spark(spark, partition="0", start=8)


def _aged_queue(make_queue):
    """Driver rows 0..9 ten days old; based files 10..14 (rows 10, 11 ten days old, 12..14 new)
    and 15..19 (new); driver rows 20..24 new."""
    q = make_queue("aged", offset_layout=OffsetLayout.BASED)
    clock.advance(seconds=-10 * 86_400)
    q.append(rows(0, 10), partition="0")
    old = datetime.fromtimestamp(clock.now_ms() / 1000, UTC)
    clock.reset()
    new = datetime.fromtimestamp(clock.now_ms() / 1000, UTC)
    folder = step_folder()
    footers = [read_footer(q, write_executor_file(q, folder, 0, list(range(10, 15)),
                                                  append_times=[old, old, new, new, new])),
               read_footer(q, write_executor_file(q, folder, 1, list(range(15, 20))))]
    commit_files(q, {"0": verify_based(q, "0", 10, footers)})
    q.append(rows(20, 5), partition="0")
    return q


def test_an_age_cut_on_based_files_is_an_absolute_offset(make_queue) -> None:
    q = _aged_queue(make_queue)
    policy = RetentionPolicy(ms=7 * DAY_MS)
    assert cuts(q, policy, now_ms=clock.now_ms()) == {"0": 12}
    dt = q.refresh()
    before = clock.now_ms() - 7 * DAY_MS
    assert _time_cut(q, dt, "0", start=0, end=25, before_ms=before) == 12
    assert _time_cut(q, dt, "0", start=13, end=25, before_ms=before) == 13
    assert _time_cut(q, dt, "0", start=0, end=11, before_ms=before) == 11  # all old there
    assert cuts(q, policy, now_ms=clock.now_ms(), below={"0": 11}) == {"0": 11}
    assert cuts(q, RetentionPolicy(ms=0), now_ms=clock.now_ms() + 1000) == {"0": 25}
    delete_below(q, cuts(q, policy, now_ms=clock.now_ms()))
    assert q.read_arrow(partition="0")["id"].to_pylist() == list(range(12, 25))
    assert cuts(q, policy, now_ms=clock.now_ms()) == {"0": 12}  # nothing older is left


def test_a_size_cut_on_based_files_removes_whole_files_oldest_offsets_first(make_queue) -> None:
    q = _aged_queue(make_queue)
    files = sorted(q.files(partition="0"), key=lambda f: f.min_offset)
    assert [(f.min_offset, f.max_offset) for f in files] == [(0, 9), (10, 14), (15, 19), (20, 24)]
    sizes = {a["path"]: a["size"] for v in range(q.version() + 1) for a in add_actions_of(q, v)}
    size = [sizes[f.path] for f in files]
    now = clock.now_ms()
    assert cuts(q, RetentionPolicy(bytes=sum(size)), now_ms=now) == {"0": 0}
    assert cuts(q, RetentionPolicy(bytes=sum(size[1:])), now_ms=now) == {"0": 10}
    assert cuts(q, RetentionPolicy(bytes=sum(size[2:])), now_ms=now) == {"0": 15}
    assert cuts(q, RetentionPolicy(bytes=size[3]), now_ms=now) == {"0": 20}
    assert cuts(q, RetentionPolicy(bytes=0), now_ms=now) == {"0": 25}


# -- 6. compaction and maintenance -------------------------------------------------------------------
def _many_small_files(make_queue, layout):
    q = make_queue("small", offset_layout=layout, partitions=("0", "1"))
    next_id = 0
    for round_ in range(3):
        for _ in range(4):
            q.append(rows(next_id, 2), partition="0")
            next_id += 2
        if layout is OffsetLayout.BASED:
            groups = [[next_id + i for i in range(k)] for k in (3, 1, 2)]
            commit_step(q, groups)
            next_id += 6
        q.append(rows(1000 + round_, 1), partition="1")
    return q


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_compaction_and_maintenance_keep_every_row_at_its_offset(make_queue, spark, layout) -> None:
    q = _many_small_files(make_queue, layout)
    total = q.next_offset("0")
    ranges = [(None, None), (3, 11), (8, 15), (9, 10), (total - 5, None)]

    def reads():
        out = {}
        for start, end in ranges:
            for p in ("0", "1"):
                out[("arrow", p, start, end)] = without_time(
                    q.read_arrow(partition=p, start=start, end=end))
                out[("spark", p, start, end)] = spark_offsets_and_ids(
                    q.read_spark(spark, partition=p, start=start, end=end))
        return out

    before, files_before, count = reads(), len(q.files()), q.count()
    assert [r[OFFSET] for r in before[("arrow", "0", None, None)]] == list(range(total))
    report = compact(q)
    assert report.files_removed > report.files_added >= 1
    assert len(q.files()) < files_before
    assert reads() == before
    maintain(q, retention_hours=0, unsafe_allow_short_retention=True)
    assert reads() == before and q.count() == count
    assert q.next_offset("0") == total and verify_log(q) == []
    fresh = q.lake.queue("small")
    assert without_time(fresh.read_arrow(partition="0")) == before[("arrow", "0", None, None)]
    fresh.append(rows(7000, 2), partition="0")
    assert fresh.read_arrow(partition="0", start=total)[OFFSET].to_pylist() == [total, total + 1]


def test_compaction_leaves_based_files_as_they_are(make_queue) -> None:
    q = _many_small_files(make_queue, OffsetLayout.BASED)
    based = sorted((f.path, f.min_offset, f.max_offset, f.base) for f in q.files() if f.base)
    report = compact(q)
    assert report.files_removed > report.files_added >= 1
    files = q.files(partition="0")
    assert sorted((f.path, f.min_offset, f.max_offset, f.base) for f in files if f.base) == based
    assert sum(f.rows for f in files) == q.next_offset("0")


def test_compaction_of_a_based_queue_merges_only_base_zero_files(make_queue) -> None:
    """maintenance.compact's contract for based offsets: files of a nonzero base are left as they
    are, the base-0 files (driver appends) are merged, and a read of a based file's range returns
    exactly its rows even though a merged base-0 file's statistics span it."""
    q = _many_small_files(make_queue, OffsetLayout.BASED)
    before = q.files(partition="0")
    compact(q)
    after = q.files(partition="0")
    assert {(f.path, f.base) for f in after if f.base} == {(f.path, f.base) for f in before if f.base}
    assert len([f for f in after if not f.base]) < len([f for f in before if not f.base])
    first = min((f for f in after if f.base), key=lambda f: f.min_offset)
    got = q.read_arrow(partition="0", start=first.min_offset, end=first.max_offset + 1)
    assert got["_offset"].to_pylist() == list(range(first.min_offset, first.max_offset + 1))


def test_a_compaction_between_verify_and_commit_leaves_the_step_its_offsets(make_queue) -> None:
    """Another process compacts the partition (merging its base-0 files) after a step's files were
    verified and before its commit: the commit still lands on top, each file based at the
    partition's next offset, and every row reads back once at its offset."""
    q = _many_small_files(make_queue, OffsetLayout.BASED)
    want = {r[OFFSET]: r["id"] for r in q.read_arrow(partition="0").to_pylist()}
    start = q.next_offset("0")
    part = executor_step(q, [[9000, 9001], [9100, 9101, 9102]])
    assert compact(q.lake.queue("small")).files_removed > 0  # another handle: another writer
    result = commit_files(q, {"0": part})
    assert result.ranges == {"0": (start, start + 5)}
    want |= dict(zip(range(start, start + 5), [9000, 9001, 9100, 9101, 9102], strict=True))
    table = q.read_arrow(partition="0")
    assert dict(zip(table[OFFSET].to_pylist(), table["id"].to_pylist(), strict=True)) == want
    assert table[OFFSET].to_pylist() == list(range(start + 5)) and verify_log(q) == []


def test_compactions_racing_based_steps_and_appends_lose_and_repeat_no_row(make_queue) -> None:
    """A thread compacts the queue over and over through its own handle while the test commits
    based steps and driver appends: afterwards the offsets are dense, every id is at the offset
    its commit returned, and the log check is clean."""
    q = _many_small_files(make_queue, OffsetLayout.BASED)
    want = {r[OFFSET]: r["id"] for r in q.read_arrow(partition="0").to_pylist()}
    stop, compactions, errors = threading.Event(), [], []

    def compactor() -> None:
        other = q.lake.queue("small")
        while not stop.is_set():
            try:
                compactions.append(compact(other).files_removed)
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)
                return

    thread = threading.Thread(target=compactor)
    thread.start()
    try:
        for i in range(12):
            base_id = 20_000 + 100 * i
            if i % 2:
                ids = [base_id, base_id + 1]
                lo, hi = q.append(rows(base_id, 2), partition="0").ranges["0"]
            else:
                ids = [base_id + k for k in range(3)]
                lo, hi = commit_step(q, [ids[:1], ids[1:]]).ranges["0"]
            want |= dict(zip(range(lo, hi), ids, strict=True))
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not errors, errors
    assert sum(compactions) > 0  # the race happened: some compactions merged files meanwhile
    table = q.lake.queue("small").read_arrow(partition="0")
    assert dict(zip(table[OFFSET].to_pylist(), table["id"].to_pylist(), strict=True)) == want
    assert table[OFFSET].to_pylist() == list(range(len(want))) and verify_log(q) == []


# -- 7. formats this version cannot read -----------------------------------------------------------
@pytest.mark.parametrize(("version", "based"), [("3", False), ("3", True), ("0", False),
                                                ("2", False), ("1", True)],
                         ids=["3-absolute", "3-based", "0", "2-without-base", "1-with-base"])
def test_opening_a_queue_of_an_unknown_format_or_layout_raises_naming_the_format(
        make_queue, lake, version, based) -> None:
    model = make_queue("model")
    config = dict(DeltaTable(model.uri).metadata().configuration)
    config[FORMAT_KEY] = version
    uri = lake.queue_uri("odd")
    DeltaTable.create(uri, full_schema(PAYLOAD, based=based),
                      partition_by=[PARTITION, BASE] if based else [PARTITION],
                      configuration=config, raise_if_key_not_exists=False)
    with pytest.raises(QueueError) as info:
        lake.queue("odd")
    assert info.value.format == version and f"format {version!r}" in str(info.value)


# -- 8. count and the log check --------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.value)
def test_count_and_the_log_check_of_driver_appends(make_queue, layout) -> None:
    q = make_queue("q", offset_layout=layout, partitions=("0", "1"))
    q.append(rows(0, 3), partition="0")
    q.append_many({"0": rows(3, 2), "1": rows(10, 4)})
    assert q.count() == 9 and verify_log(q) == []


def test_count_and_the_log_check_of_a_based_queue_with_mixed_files(mixed) -> None:
    assert mixed.count() == 16
    assert verify_log(mixed) == []
    commit_step(mixed, [[700], [701, 702]])
    mixed.append(rows(800, 3), partition="0")
    assert mixed.count() == 22 and mixed.next_offset("0") == 22
    assert verify_log(mixed) == []
    assert verify_log(mixed.lake.queue("mixed")) == []


def test_the_log_check_of_a_based_queue_whose_newest_rows_are_in_based_files(make_queue) -> None:
    q = make_queue("q", offset_layout=OffsetLayout.BASED, partitions=("0", "1"))
    q.append(rows(0, 2), partition="0")
    commit_step(q, [[10, 11, 12], [13]])  # offsets 2..5, the partition's newest
    assert q.count() == 6 and q.next_offset("0") == 6
    assert max(f.max_offset for f in q.files(partition="0")) == 5
    assert verify_log(q) == []


def test_the_log_check_finds_a_based_commit_that_declares_more_rows_than_its_files_hold(
        make_queue) -> None:
    q = make_queue("q", offset_layout=OffsetLayout.BASED)
    q.append(rows(0, 2), partition="0")
    part = executor_step(q, [[10, 11]])
    # the part claims 2 rows more than its files hold: part:0 becomes 6, the files hold 4 rows
    commit_files(q, {"0": WrittenPart(part.partition, part.start, part.rows + 2, part.files,
                                      based=True)})
    assert q.count() == 4
    assert {p.kind for p in verify_log(q)} == {"rows", "commit"}


def test_a_tailer_reads_a_based_queue_in_absolute_offsets(mixed) -> None:
    tailer = mixed.tailer("t", partition="0")
    seen = []
    while len(seen) < 16:
        batch = tailer.read_arrow(3)
        assert batch.num_rows and BASE not in batch.column_names
        seen += offsets_and_ids(batch)
        tailer.commit()
    assert seen == sorted(mixed.want.items())
    assert tailer.read_arrow(3).num_rows == 0 and tailer.committed_position() == 16


def test_a_redeploy_declaring_another_layout_keeps_the_existing_queues_own(lake) -> None:
    """A graph changed to declare ``based`` for a queue created ``absolute`` (or back): the layout
    is fixed at creation, so ``create_queue(exist_ok=True)`` returns the queue as it is and its
    rows keep their offsets (a partition column cannot be added to a table)."""
    schema = pa.schema([("id", pa.int64())])
    first = lake.create_queue("kept", schema=schema, offset_layout=OffsetLayout.ABSOLUTE)
    first.append(pa.table({"id": [1, 2]}), partition="0")
    again = lake.create_queue("kept", schema=schema, exist_ok=True, offset_layout=OffsetLayout.BASED)
    assert again.offset_layout is OffsetLayout.ABSOLUTE and not again.based
    again.append(pa.table({"id": [3]}), partition="0")
    assert again.read_arrow(partition="0")["_offset"].to_pylist() == [0, 1, 2]
