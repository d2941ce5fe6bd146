"""One ``Queue`` handle over time: shared between threads (dense offsets, every row once), and kept
open while its table is deleted and created again (the handle moves to the new table)."""

from __future__ import annotations

import itertools
import shutil
import threading
from collections import Counter
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cues_platform.queues import Lake
from cues_platform.queues.appender import AppendResult
from tests.support import PAYLOAD, rows

_dirs = itertools.count()


def table_rows(uri: str) -> pa.Table:
    """Every row of the table as delta-rs reads it (not through our handle)."""
    return DeltaTable(uri).to_pyarrow_table()


def assert_dense(uri: str, partitions: tuple[str, ...]) -> dict[str, int]:
    """Offsets 0..n-1 of each partition, each once; returns n per partition."""
    t = table_rows(uri)
    counts = {}
    for p in partitions:
        offsets = [o for o, part in zip(t["_offset"].to_pylist(), t["_partition"].to_pylist(),
                                        strict=True) if part == p]
        dups = {o: c for o, c in Counter(offsets).items() if c > 1}
        assert not dups, f"partition {p}: offsets taken twice: {sorted(dups)[:10]}"
        assert sorted(offsets) == list(range(len(offsets))), f"partition {p}: offsets not dense"
        counts[p] = len(offsets)
    return counts


def run_threads(targets: list, timeout: float = 300) -> None:
    """Run each target in its own thread, started together; re-raise the first failure."""
    barrier = threading.Barrier(len(targets))
    errors: list[BaseException] = []

    def wrap(target) -> None:
        barrier.wait()
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a thread did not finish"
    if errors:
        raise errors[0]


def test_four_threads_appending_through_one_handle_take_dense_offsets(lake: Lake) -> None:
    """The review's reproduction (issue 22 item 4): 4 threads x 40 appends through ONE handle
    gave 33 duplicated offsets and next_offset 119 for 160 rows."""
    q = lake.create_queue("shared", schema=PAYLOAD)

    def work(t: int):
        return lambda: [q.append(rows(t * 1000 + i, 1), partition="0") for i in range(40)]

    run_threads([work(t) for t in range(4)])
    assert assert_dense(q.uri, ("0",)) == {"0": 160}
    assert q.next_offset("0") == 160
    assert Lake(root=lake.root).queue("shared").next_offset("0") == 160  # a fresh handle agrees
    assert sorted(table_rows(q.uri)["id"].to_pylist()) == sorted(
        t * 1000 + i for t in range(4) for i in range(40))


# -- property: any mix of operations from several threads on one handle ---------------------------
PARTS = ("a", "b")
op = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(PARTS), st.integers(1, 3)),
    st.tuples(st.just("append_many"), st.integers(1, 3), st.integers(1, 3)),
    st.tuples(st.just("refresh")),
    st.tuples(st.just("next_offset"), st.sampled_from(PARTS)),
)
thread_ops = st.lists(st.lists(op, min_size=1, max_size=8), min_size=2, max_size=4)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=thread_ops)
def test_threads_sharing_one_handle_keep_offsets_dense(tmp_path: Path, plan) -> None:
    """Threads mixing append, append_many over two partitions, refresh and next_offset on one
    handle: per partition offsets 0..n-1 each once (read with delta-rs), every append's rows at
    exactly the offsets it reported, next_offset never going back within a thread and ending at n."""
    lake = Lake(root=str(tmp_path / f"lake{next(_dirs)}"))
    q = lake.create_queue("q", schema=PAYLOAD, partitions=PARTS)
    ids = itertools.count()
    id_lock = threading.Lock()
    results: list[tuple[AppendResult, dict[str, list[int]]]] = []

    def batch(n: int) -> tuple[pa.Table, list[int]]:
        with id_lock:
            first = next(ids)
            for _ in range(n - 1):
                next(ids)
        return rows(first, n), list(range(first, first + n))

    def worker(ops):
        def run() -> None:
            seen = dict.fromkeys(PARTS, 0)
            for kind, *args in ops:
                if kind == "append":
                    part, n = args
                    data, batch_ids = batch(n)
                    result = q.append(data, partition=part)
                    results.append((result, {part: batch_ids}))
                    seen[part] = max(seen[part], result.ranges[part][1])
                elif kind == "append_many":
                    (data_a, ids_a), (data_b, ids_b) = batch(args[0]), batch(args[1])
                    result = q.append_many({"a": data_a, "b": data_b})
                    results.append((result, {"a": ids_a, "b": ids_b}))
                    for p in PARTS:
                        seen[p] = max(seen[p], result.ranges[p][1])
                elif kind == "refresh":
                    q.refresh()
                else:
                    (part,) = args
                    now = q.next_offset(part)
                    assert now >= seen[part], f"next_offset of {part} went back: {now} < {seen[part]}"
                    seen[part] = now
        return run

    run_threads([worker(ops) for ops in plan])
    counts = assert_dense(q.uri, PARTS)
    assert {p: q.next_offset(p) for p in PARTS} == counts
    t = table_rows(q.uri)
    where = {(part, i): off for part, i, off in zip(t["_partition"].to_pylist(), t["id"].to_pylist(),
                                                    t["_offset"].to_pylist(), strict=True)}
    assert len(where) == t.num_rows  # every row once
    for result, batch_ids in results:
        for part, wanted in batch_ids.items():
            start, end = result.ranges[part]
            assert [where[(part, i)] for i in wanted] == list(range(start, end))
    assert sum(counts.values()) == sum(len(v) for _, b in results for v in b.values())


# -- a handle kept across the table's delete and re-create ---------------------------------------
def test_a_handle_kept_across_delete_and_create_moves_to_the_new_table(lake: Lake) -> None:
    """Issue 22 item 9b. The old handle had read 5 commits of the old table; the new table (new
    table id, other partitions) gets 7 commits, so a handle replaying entries
    6.. on top of the old table's state would show a mix. The handle notices its version's commit
    entry is another file and opens the new table: append and read see the new table only."""
    old = lake.create_queue("orders", schema=PAYLOAD, partitions=("0", "old"))
    for i in range(4):
        old.append(rows(100 + i, 1), partition="old")
    assert old.version() == 4 and old.next_offset("old") == 4
    old_id = old.table.metadata().id

    shutil.rmtree(lake.local_path(old.uri))
    new = Lake(root=lake.root).create_queue("orders", schema=PAYLOAD, partitions=("0", "new"))
    for i in range(6):
        new.append(rows(i, 1), partition="new")  # versions 1..6: past the old handle's version

    result = old.append(rows(50, 2), partition="new")  # through the handle kept open
    assert result.ranges == {"new": (6, 8)}
    assert old.table.metadata().id == new.table.metadata().id != old_id
    assert old.partitions == ("0", "new")
    assert old.read_arrow(partition="new")["id"].to_pylist() == [0, 1, 2, 3, 4, 5, 50, 51]
    assert old.next_offset("new") == 8
    t = table_rows(new.uri)  # what delta-rs sees: the new table's rows only, dense
    assert sorted(t["id"].to_pylist()) == [0, 1, 2, 3, 4, 5, 50, 51]
    assert assert_dense(new.uri, ("0", "new")) == {"0": 0, "new": 8}


def test_a_handle_kept_across_a_re_create_with_fewer_commits_takes_the_new_definition(
        lake: Lake) -> None:
    """The version goes backwards (the new table has 2 commits where the old handle had read 6),
    and the new table's contract has another column: the handle takes the new table's schema,
    partitions and offsets, and commits no entry past the new table's log (no gap)."""
    old = lake.create_queue("orders", schema=PAYLOAD)
    for i in range(6):
        old.append(rows(i, 1), partition="0")
    shutil.rmtree(lake.local_path(old.uri))
    wider = PAYLOAD.append(pa.field("amount", pa.int64()))
    new = Lake(root=lake.root).create_queue("orders", schema=wider, partitions=("0", "eu"))
    new.append(rows(900, 1).append_column("amount", pa.array([7], pa.int64())), partition="0")

    assert old.next_offset("0") == 1
    batch = rows(901, 1).append_column("amount", pa.array([8], pa.int64()))
    assert old.append(batch, partition="0").ranges == {"0": (1, 2)}
    assert old.payload_schema.equals(wider) and old.partitions == ("0", "eu")
    got = old.read_arrow(partition="0")
    assert (got["id"].to_pylist(), got["amount"].to_pylist()) == ([900, 901], [7, 8])
    assert DeltaTable(new.uri).version() == 2  # no gap in the new table's log
    assert assert_dense(new.uri, ("0", "eu")) == {"0": 2, "eu": 0}
