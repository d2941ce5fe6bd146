"""Appends: one commit per batch, dense offsets under concurrent processes, clean failures."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
from deltalake import DeltaTable

from cues_platform.queues import Lake
from tests.support import ROOT, rows

APPENDER = """
import sys
from cues_platform.queues import Lake
import pyarrow as pa
lake = Lake(root=sys.argv[1]); q = lake.queue("events")
part, n, me = sys.argv[2], int(sys.argv[3]), sys.argv[4]
for i in range(n):
    q.append({"id": [i, i], "note": [me, me]}, partition=part)
"""


def _spawn(lake: Lake, part: str, n: int, me: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", APPENDER, lake.root, part, str(n), me],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_one_append_is_one_commit_with_dense_offsets(make_queue) -> None:
    q = make_queue()
    v0 = q.version()
    first = q.append(rows(0, 3), partition="0")
    second = q.append(rows(3, 2), partition="0")
    assert (first.first_offset, first.last_offset) == (0, 2)
    assert (second.first_offset, second.last_offset) == (3, 4)
    assert q.version() == v0 + 2
    assert DeltaTable(q.uri).history(1)[0]["cues.ranges"] == "0:3-5"
    assert q.read_arrow(partition="0")["_offset"].to_pylist() == [0, 1, 2, 3, 4]


def test_four_processes_on_one_partition_get_dense_unique_offsets(make_queue, lake) -> None:
    make_queue()
    procs = [_spawn(lake, "0", 15, f"w{i}") for i in range(4)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    table = lake.queue("events").read_arrow(partition="0")
    assert table["_offset"].to_pylist() == list(range(4 * 15 * 2))
    # each writer's rows are intact and in its own order
    for i in range(4):
        mine = table.filter(pa.compute.equal(table["note"], f"w{i}"))["id"].to_pylist()
        assert mine == [k for k in range(15) for _ in range(2)]


def test_four_processes_on_four_partitions_never_retry(make_queue, lake) -> None:
    make_queue(partitions=("a", "b", "c", "d"))
    script = (
        APPENDER.replace("q.append(", "r = q.append(")
        + "\n    assert r.attempts == 1, r.attempts\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, lake.root, p, "15", p],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in "abcd"
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    q = lake.queue("events")
    for p in "abcd":
        assert q.read_arrow(partition=p)["_offset"].to_pylist() == list(range(30))


def test_multi_partition_append_is_atomic(make_queue) -> None:
    q = make_queue(partitions=("a", "b"))
    result = q.append_many({"a": rows(0, 2), "b": rows(10, 3)})
    assert result.ranges == {"a": (0, 2), "b": (0, 3)}
    assert result.version == q.version()


def test_metadata_columns_are_filled(make_queue) -> None:
    q = make_queue()
    q.append(rows(0, 2), partition="0", delivery_hash="ab" * 16, message_type="order")
    table = q.read_arrow(partition="0")
    assert table["_partition"].to_pylist() == ["0", "0"]
    assert table["_delivery_hash"].to_pylist() == ["ab" * 16] * 2
    assert table["_message_type"].to_pylist() == ["order", "order"]
    assert table["_txn_id"].null_count == 2
    assert table["_append_time"].null_count == 0
