"""Committing written Parquet files by reference: density is verified from the footers alone,
and a partition that moved is never committed over (the caller rewrites)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cues_platform.queues.by_reference import (
    NotCommittableError,
    OffsetsMovedError,
    append_written,
    commit_files,
    read_footer,
    verify_written,
)
from cues_platform.queues.handle import verify_log
from cues_platform.queues.schema import METADATA_FIELDS, OFFSET, PARTITION
from tests.support import PAYLOAD, rows

FILE_SCHEMA = pa.schema([*PAYLOAD, *(f for f in METADATA_FIELDS if f.name != PARTITION)])


def write_file(queue, relative: str, offsets: list[int], *, ids: list[int] | None = None,
               schema: pa.Schema = FILE_SCHEMA) -> str:
    """A file as the executors write it: payload and metadata columns, no partition column."""
    n = len(offsets)
    ids = ids if ids is not None else offsets
    data = {"id": ids, "note": [f"n{i}" for i in ids], OFFSET: offsets,
            "_producer_id": [None] * n, "_producer_seq": [None] * n, "_delivery_hash": ["h"] * n,
            "_message_type": ["message"] * n, "_append_time": [datetime.now(UTC)] * n,
            "_txn_id": [None] * n}
    path = Path(queue.uri.removeprefix("file://")) / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(data, schema=schema), path)
    return relative


def footers(queue, *specs: tuple[str, list[int]]):
    return [read_footer(queue, write_file(queue, rel, offs)) for rel, offs in specs]


def test_dense_files_commit_in_one_version_and_read_back_in_order(make_queue) -> None:
    q = make_queue("out")
    q.append(rows(0, 2), partition="0")
    part = verify_written(q, "0", 2, footers(q, ("_partition=0/s/b.parquet", [5, 6, 7]),
                                             ("_partition=0/s/a.parquet", [2, 3, 4])))
    before = q.version()
    result = commit_files(q, {"0": part}, app_transactions=[("proc:x", 0)])
    assert result.version == before + 1 and result.ranges == {"0": (2, 8)}
    assert q.read_arrow(partition="0")[OFFSET].to_pylist() == list(range(8))
    assert q.next_offset("0") == 8
    assert q.table.transaction_version("proc:x") == 0
    assert verify_log(q) == []


@pytest.mark.parametrize("second", [[6, 7], [4, 5], [5, 5]], ids=["gap", "repeat", "duplicate-in-file"])
def test_a_gap_or_a_repeat_is_refused_before_any_commit(make_queue, second) -> None:
    q = make_queue("out")
    with pytest.raises(NotCommittableError):
        verify_written(q, "0", 0, footers(q, ("_partition=0/s/a.parquet", [0, 1, 2, 3, 4]),
                                          ("_partition=0/s/b.parquet", second)))
    assert q.next_offset("0") == 0


def test_files_that_do_not_start_at_the_partitions_next_offset_are_refused(make_queue) -> None:
    q = make_queue("out")
    with pytest.raises(NotCommittableError):
        verify_written(q, "0", 0, footers(q, ("_partition=0/s/a.parquet", [1, 2])))


def test_a_payload_type_other_than_the_queues_is_refused(make_queue) -> None:
    q = make_queue("out")
    schema = FILE_SCHEMA.set(0, pa.field("id", pa.int32(), nullable=False))
    rel = write_file(q, "_partition=0/s/a.parquet", [0, 1], schema=schema)
    with pytest.raises(NotCommittableError, match="'id'"):
        verify_written(q, "0", 0, [read_footer(q, rel)])


def test_a_partition_that_moved_is_not_committed_over_and_append_written_rewrites(make_queue) -> None:
    q = make_queue("out")
    part = verify_written(q, "0", 0, footers(q, ("_partition=0/s/a.parquet", [0, 1, 2])))
    q.append(rows(100, 1), partition="0")  # another writer takes offset 0
    with pytest.raises(OffsetsMovedError) as info:
        commit_files(q, {"0": part})
    assert (info.value.expected, info.value.found) == (0, 1)
    result = append_written(q, {"0": part}, delivery_hash="h")
    assert result.ranges == {"0": (1, 4)}
    table = q.read_arrow(partition="0")
    assert table[OFFSET].to_pylist() == [0, 1, 2, 3]
    assert table["id"].to_pylist() == [100, 0, 1, 2]
    assert [f.path for f in q.files()].count("_partition=0/s/a.parquet") == 0  # never referenced


@pytest.mark.parametrize(("offsets", "named"), [([1, 1, 3], "_offset 1 more than once, no _offset 2"),
                                                ([1, 3, 3], "_offset 3 more than once, no _offset 2")],
                         ids=["s-s-s+2", "s-s+2-s+2"])
def test_a_file_whose_footer_agrees_but_whose_offsets_repeat_is_refused(make_queue, offsets, named) -> None:
    """Issue 22 item 9a: min, max and count of [s, s, s+2] agree with a dense file; the _offset
    column itself is read and refused, nothing is committed."""
    q = make_queue("out")
    q.append(rows(100, 1), partition="0")  # s = 1
    before = q.version()
    footer = read_footer(q, write_file(q, "_partition=0/s/a.parquet", offsets))
    assert (footer.min_offset, footer.max_offset, footer.rows) == (1, 3, 3)  # the footer is fooled
    with pytest.raises(NotCommittableError) as info:
        verify_written(q, "0", 1, [footer])
    err = info.value
    assert (err.queue, err.partition, err.path, err.start, err.rows) == ("out", "0", footer.path, 1, 3)
    assert named in str(err) and "rewrite the rows" in str(err) and not err.retryable
    assert q.version() == before and q.next_offset("0") == 1
    assert [f.path for f in q.files()].count(footer.path) == 0


def test_a_dense_file_in_another_order_is_accepted_and_reads_back_sorted(make_queue) -> None:
    q = make_queue("out")
    part = verify_written(q, "0", 0, footers(q, ("_partition=0/s/a.parquet", [2, 0, 1, 3])))
    assert (part.start, part.rows) == (0, 4)
    commit_files(q, {"0": part})
    table = q.read_arrow(partition="0")
    assert table[OFFSET].to_pylist() == [0, 1, 2, 3] and table["id"].to_pylist() == [0, 1, 2, 3]
    assert verify_log(q) == []


def test_commits_by_reference_through_a_shared_handle_keep_offsets_dense_and_name_their_version(
        make_queue, lake) -> None:
    """Threads of one handle: one commits written files by reference (append_written), one
    appends rows, and another handle appends to another partition (delta-rs rebases over it).
    The offsets checked on the snapshot and the commit built on it are one step under the
    handle's lock: partition 0 stays dense with every row once, and each commit by reference
    reports the version whose commit carries its token (searched from before the commit)."""
    from deltalake import DeltaTable

    from tests.queues.test_threads import assert_dense, run_threads

    q = make_queue("out", partitions=("0", "1"))
    other = lake.queue("out")  # a second handle: its commits are rebased over, never conflict
    by_reference = []

    def commit_written() -> None:
        for i in range(15):
            start = q.next_offset("0")
            ids = [10_000 + 2 * i, 10_000 + 2 * i + 1]
            rel = write_file(q, f"_partition=0/s/{i}.parquet", [start, start + 1], ids=ids)
            part = verify_written(q, "0", start, [read_footer(q, rel)])
            by_reference.append(append_written(q, {"0": part}, delivery_hash="h"))

    def append_rows() -> None:
        for i in range(15):
            q.append(rows(20_000 + i, 1), partition="0")

    def append_other() -> None:
        for i in range(15):
            other.append(rows(30_000 + i, 1), partition="1")

    run_threads([commit_written, append_rows, append_other])
    assert assert_dense(q.uri, ("0", "1")) == {"0": 45, "1": 15}
    ids = DeltaTable(q.uri).to_pyarrow_table()["id"].to_pylist()
    assert sorted(ids) == sorted([*range(10_000, 10_030), *range(20_000, 20_015),
                                  *range(30_000, 30_015)])
    history = {h["version"]: h for h in DeltaTable(q.uri).history()}
    committed = [r for r in by_reference if "cues.commit" in r.metadata]
    assert committed, "no commit by reference landed (all 15 rewritten)"
    for result in committed:
        assert result.version is not None
        assert history[result.version].get("cues.commit") == result.metadata["cues.commit"]
    assert q.next_offset("0") == 45 and verify_log(q) == []
