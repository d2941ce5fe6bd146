"""Declaring partitions: ``Queue.add_partitions`` and ``create_queue(exist_ok=True)`` are
idempotent and race-safe (concurrent callers in other processes or threads: the union of what
everyone asked for, in order, none lost), and a string where partition names are expected is
refused."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from deltalake import DeltaTable

from cues_platform.errors import ConfigurationError
from cues_platform.queues import Lake
from tests.support import PAYLOAD, ROOT, rows

ROUNDS = 12

# One process of the stress test: waits for the start file, then in each round declares one
# partition of its own and one shared with the other process (alternately through its handle and
# through create_queue(exist_ok=True)), checks the handle sees both, and appends a row to each.
CHILD = """
import json, sys, time
from pathlib import Path
from cues_platform.queues import Lake
from tests.support import PAYLOAD, rows

root, side, rounds, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
lake = Lake(root=root)
q = lake.queue("q")
deadline = time.monotonic() + 60
while not start.exists():
    if time.monotonic() > deadline:
        sys.exit("no start signal")
    time.sleep(0.001)
asked = []
for r in range(rounds):
    want = [f"{side}{r}", f"shared{r}"]
    if r % 3 == 2:
        q = lake.create_queue("q", schema=PAYLOAD, partitions=want, exist_ok=True)
    else:
        q.add_partitions(want)
    asked += want
    missing = [p for p in want if p not in q.partitions]
    assert not missing, f"round {r}: {missing} not in {q.partitions}"
    for p in want:
        q.append(rows(r, 1), partition=p)
print(json.dumps(asked))
"""


def declared(uri: str) -> list[str]:
    return json.loads(DeltaTable(uri).metadata().configuration["cues.partitions"])


def test_two_processes_adding_partitions_lose_none(lake: Lake, tmp_path) -> None:
    """Before: delta-rs' 'Metadata changed since last commit' escaped add_partitions in 4 of 20
    rounds of two threads, and a runner refreshing its lanes died of it."""
    q = lake.create_queue("q", schema=PAYLOAD)
    start = tmp_path / "start"
    children = [subprocess.Popen([sys.executable, "-c", CHILD, lake.root, side, str(ROUNDS), str(start)],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for side in ("left", "right")]
    start.touch()
    asked: list[str] = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, f"child failed ({child.returncode}):\n{out}\n{err}"
        asked += json.loads(out.strip().splitlines()[-1])
    names = declared(q.uri)
    assert len(names) == len(set(names)), f"a partition declared twice: {names}"
    assert set(asked) | {"0"} == set(names)
    # the order each partition was first declared is kept: "0", then each side's in its own order
    for side in ("left", "right"):
        mine = [n for n in names if n.startswith(side)]
        assert mine == [f"{side}{r}" for r in range(ROUNDS)]
    assert names[0] == "0"
    fresh = Lake(root=lake.root).queue("q")
    assert set(fresh.partitions) == set(names)
    assert q.refresh() and set(q.partitions) == set(names)  # the handle opened before, refreshed
    # every append landed once: one row per side in each own partition, two in each shared one
    assert {p: fresh.next_offset(p) for p in names} == {
        **{f"{s}{r}": 1 for s in ("left", "right") for r in range(ROUNDS)},
        **{f"shared{r}": 2 for r in range(ROUNDS)}, "0": 0}


def test_threads_adding_partitions_through_one_handle_and_two_lose_none(lake: Lake) -> None:
    q = lake.create_queue("q", schema=PAYLOAD)
    other = Lake(root=lake.root).queue("q")
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def work(handle, side: str) -> None:
        barrier.wait()
        try:
            for r in range(8):
                handle.add_partitions([f"{side}{r}", f"shared{r}"])
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(h, s))
               for h, s in ((q, "a"), (q, "b"), (other, "c"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    names = declared(q.uri)
    assert set(names) == {"0"} | {f"{s}{r}" for s in "abc" for r in range(8)} | {
        f"shared{r}" for r in range(8)}
    assert len(names) == len(set(names))


def test_adding_declared_partitions_commits_nothing(make_queue) -> None:
    q = make_queue(partitions=("0", "eu"))
    before = q.version()
    q.add_partitions(["eu", "0"])
    q.add_partitions([])
    assert q.version() == before and q.partitions == ("0", "eu")
    q.add_partitions(["us", "eu", "us"])
    assert q.partitions == ("0", "eu", "us") and q.version() == before + 1


@pytest.mark.parametrize("value", ["ab", b"ab", bytearray(b"ab")])
def test_a_string_for_partitions_is_refused(lake: Lake, value) -> None:
    """'ab' used to declare partitions "a" and "b"."""
    with pytest.raises(ConfigurationError, match=r"create_queue\('q'\): partitions must be a sequence "
                                                 r"of partition names such as \['a', 'b'\].*pass \['ab'\]") as info:
        lake.create_queue("q", schema=PAYLOAD, partitions=value)
    assert info.value.argument == "partitions"
    assert not lake.has_queue("q")
    q = lake.create_queue("q", schema=PAYLOAD, partitions=["ab"])
    before = q.version()
    with pytest.raises(ConfigurationError, match=r"queue 'q': add_partitions: partitions must be a "
                                                 r"sequence .*pass \['ab'\]"):
        q.add_partitions(value)
    assert q.version() == before and q.partitions == ("ab",)


def test_a_number_for_partitions_is_refused(lake: Lake) -> None:
    with pytest.raises(ConfigurationError, match=r"partitions must be a sequence of partition names"):
        lake.create_queue("q", schema=PAYLOAD, partitions=3)  # type: ignore[arg-type]
    assert not lake.has_queue("q")


def test_appends_and_partition_changes_at_the_same_time_keep_offsets_dense(lake: Lake) -> None:
    """A metadata change concurrent with appends: the appends retry over it (delta-rs may reject
    them with 'Metadata changed'), none is lost or doubled."""
    q = lake.create_queue("q", schema=PAYLOAD)
    other = Lake(root=lake.root).queue("q")
    stop = threading.Event()
    errors: list[BaseException] = []

    def add() -> None:
        try:
            for r in range(15):
                other.add_partitions([f"x{r}"])
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread below
            errors.append(exc)
        finally:
            stop.set()

    adder = threading.Thread(target=add)
    adder.start()
    n = 0
    deadline = time.monotonic() + 120
    while not stop.is_set() and time.monotonic() < deadline:
        q.append(rows(n, 1), partition="0")
        n += 1
    adder.join(120)
    assert not errors, errors
    offsets = sorted(DeltaTable(q.uri).to_pyarrow_table()["_offset"].to_pylist())
    assert offsets == list(range(n)) and q.next_offset("0") == n
    assert set(q.refresh() and q.partitions) == {"0"} | {f"x{r}" for r in range(15)}
