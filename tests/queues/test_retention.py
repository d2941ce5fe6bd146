"""Retention mechanics (queues/retention.py): a partition's start offset, reads below it, the
policy's cuts, the delete commit, and tailers (expendable or not). Who still needs what is
tests/processing/test_retention.py's."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cues_platform import clock
from cues_platform.errors import ConfigurationError
from cues_platform.queues import OffsetOutOfRangeError
from cues_platform.queues.handle import verify_log
from cues_platform.queues.retention import (
    RetentionPolicy,
    cuts,
    delete_below,
    policy_of,
    set_policy,
)

SCHEMA = pa.schema([("v", pa.int64())])


@pytest.fixture(autouse=True)
def _real_clock():
    yield
    clock.reset()


def fill(q, partition: str, batches: int, size: int = 10) -> None:
    for i in range(batches):
        q.append(pa.table({"v": list(range(i * size, (i + 1) * size))}), partition=partition)


def test_a_delete_moves_the_start_and_keeps_every_offset_above_it_dense(make_queue) -> None:
    q = make_queue("q", schema=SCHEMA, partitions=["0", "1"])
    fill(q, "0", 5)
    fill(q, "1", 1)
    deleted = delete_below(q, {"0": 25})  # 25 is inside the third file: it is rewritten
    assert [(d.partition, d.old_start, d.new_start, d.rows) for d in deleted] == [("0", 0, 25, 25)]
    assert q.start_offsets() == {"0": 25, "1": 0}
    assert q.read_arrow(partition="0")["_offset"].to_pylist() == list(range(25, 50))
    assert q.read_arrow(partition="1")["_offset"].to_pylist() == list(range(10))
    # offsets are never reused: the next append goes on at 50, the start stays
    q.append(pa.table({"v": [1]}), partition="0")
    assert q.end_offsets()["0"] == 51 and q.start_offset("0") == 25
    assert verify_log(q) == []  # the delete commit is a healthy commit of the queue


def test_a_read_below_the_start_raises_offset_out_of_range(make_queue) -> None:
    q = make_queue("q", schema=SCHEMA)
    fill(q, "0", 3)
    delete_below(q, {"0": 20})
    with pytest.raises(OffsetOutOfRangeError) as caught:
        q.read_arrow(partition="0", start=5)
    assert (caught.value.queue, caught.value.partition, caught.value.offset,
            caught.value.start_offset) == ("q", "0", 5, 20)
    assert caught.value.retryable is False
    assert "read from 20" in str(caught.value)
    assert q.read_arrow(partition="0", start=20)["v"].to_pylist() == list(range(20, 30))


def test_the_start_never_moves_back_and_a_cut_past_the_end_is_refused(make_queue) -> None:
    q = make_queue("q", schema=SCHEMA)
    fill(q, "0", 3)
    delete_below(q, {"0": 20})
    version = q.version()
    assert delete_below(q, {"0": 10}) == [] and q.version() == version  # no commit
    with pytest.raises(ConfigurationError, match="past its next offset 30"):
        delete_below(q, {"0": 31})
    delete_below(q, {"0": 30})  # every row gone: the partition is empty, its offsets go on
    assert q.read_arrow(partition="0").num_rows == 0 and q.end_offsets()["0"] == 30
    q.append(pa.table({"v": [7]}), partition="0")
    assert q.read_arrow(partition="0")["_offset"].to_pylist() == [30]


def test_a_policy_is_two_table_properties_and_bad_values_are_refused(make_queue) -> None:
    q = make_queue("q", schema=SCHEMA)
    assert policy_of(q) == RetentionPolicy() and not policy_of(q).enabled
    assert set_policy(q, ms=86_400_000, bytes=None) == RetentionPolicy(ms=86_400_000)
    assert policy_of(q.lake.queue("q")).ms == 86_400_000  # another handle reads it
    with pytest.raises(ConfigurationError, match="cues.retention.bytes must be a whole number"):
        set_policy(q, ms=None, bytes=-5)
    with pytest.raises(ConfigurationError, match="cues.retention.ms"):
        set_policy(q, ms=1.5, bytes=None)  # type: ignore[arg-type]
    assert set_policy(q, ms=None, bytes=None) == RetentionPolicy()


def test_an_age_cut_reads_append_times_on_the_platform_clock(make_queue) -> None:
    q = make_queue("q", schema=SCHEMA)
    clock.advance(seconds=-10 * 86_400)  # appended "ten days ago"
    fill(q, "0", 2)
    clock.reset()
    fill(q, "0", 1)  # appended now
    policy = RetentionPolicy(ms=7 * 86_400_000)
    assert cuts(q, policy, now_ms=clock.now_ms()) == {"0": 20}
    # never past what a reader needs
    assert cuts(q, policy, now_ms=clock.now_ms(), below={"0": 12}) == {"0": 12}
    # a clock a year ahead: every row is old, the cut is the end (bounded by readers one level up)
    clock.advance(seconds=365 * 86_400)
    assert cuts(q, policy, now_ms=clock.now_ms()) == {"0": 30}


def test_a_size_cut_removes_whole_files_oldest_first(make_queue) -> None:
    q = make_queue("q", schema=SCHEMA)
    fill(q, "0", 4)
    sizes = sorted((f.max_offset, f.path) for f in q.files(partition="0"))
    assert len(sizes) == 4
    one_file = q.table.get_add_actions(flatten=True)["size_bytes"].to_pylist()[0]
    # room for two files (and a half): the two oldest go
    assert cuts(q, RetentionPolicy(bytes=int(one_file * 2.5)), now_ms=clock.now_ms()) == {"0": 20}
    assert cuts(q, RetentionPolicy(bytes=one_file * 100), now_ms=clock.now_ms()) == {"0": 0}


def test_a_new_tailer_starts_at_the_start_offset_and_seek_start_goes_there(make_queue) -> None:
    q = make_queue("q", schema=SCHEMA)
    fill(q, "0", 3)
    delete_below(q, {"0": 10})
    t = q.tailer("fresh", partition="0")
    assert t.position == 10 and t.committed_position() == 10
    assert t.read_arrow(5)["_offset"].to_pylist() == list(range(10, 15))
    assert t.seek("start") == 10
    with pytest.raises(OffsetOutOfRangeError):
        t.seek(3)


def test_a_tailer_behind_the_start_raises_unless_it_is_expendable(make_queue) -> None:
    q = make_queue("q", schema=SCHEMA)
    fill(q, "0", 3)
    kept = q.tailer("kept", partition="0")
    kept.commit(0)
    spare = q.tailer("spare", partition="0", expendable=True)
    spare.commit(0)
    delete_below(q, {"0": 20})  # (processing/retention.py would not pass "kept": see there)
    with pytest.raises(OffsetOutOfRangeError):
        kept.read_arrow(5)
    got = spare.read_arrow(5)
    assert got["_offset"].to_pylist() == list(range(20, 25))
    assert spare.retained_away == 20  # told how many offsets it lost
    with pytest.raises(OffsetOutOfRangeError, match="below the partition's start offset 20"):
        kept.commit(3)


def test_positions_remember_which_tailers_are_expendable(make_queue) -> None:
    from cues_platform.queues.positions import PositionStore, TailerPosition

    q = make_queue("q", schema=SCHEMA, partitions=["0", "1"])
    fill(q, "0", 1)
    q.tailer("a", partition="0").commit(4)
    q.tailer("b", partition="0", expendable=True).commit(7)
    q.tailer("b", partition="1", expendable=True).commit(0)
    assert PositionStore(q.lake).tailers("q") == [
        TailerPosition("a", "0", 4, False), TailerPosition("b", "0", 7, True),
        TailerPosition("b", "1", 0, True)]
    q.tailer("b", partition="0").commit(8)  # declared again without expendable: it holds now
    assert PositionStore(q.lake).tailers("q")[1] == TailerPosition("b", "0", 8, False)


def test_moving_expendable_tailers_up_never_moves_one_back(make_queue, lake) -> None:
    """Retention's Step 4 (``PositionStore.move_up``) compares each tailer's committed position on
    the snapshot it commits on: one that committed past the new start since retention read the
    positions stays where it is (moving it back would make it read those rows again)."""
    from cues_platform.queues.positions import PositionStore

    q = make_queue("q", schema=SCHEMA)
    fill(q, "0", 4)
    q.tailer("ahead", partition="0", expendable=True).commit(30)
    q.tailer("behind", partition="0", expendable=True).commit(5)
    moved = PositionStore(lake).move_up([("q", "ahead", "0", 20), ("q", "behind", "0", 20)])
    assert moved == [("behind", "0", 5, 20)]
    assert [(t.tailer, t.position, t.expendable) for t in PositionStore(lake).tailers("q")] == [
        ("ahead", 30, True), ("behind", 20, True)]


def test_a_tailers_commit_racing_retentions_move_of_it_is_made_again_not_lost(make_queue, lake) -> None:
    """The tailer commits its position on one handle while retention moves it on another (a
    `cues jepsen --time` run saw the tailer's commit refused as a concurrent transaction, an
    untyped CommitFailedError). The refused commit is made again on the newer snapshot: no
    error, and the tailer's last commit stands."""
    import threading

    from cues_platform.queues import Lake
    from cues_platform.queues.positions import PositionStore

    make_queue("q", schema=SCHEMA)
    errors: list[BaseException] = []

    def retention() -> None:
        store = PositionStore(Lake(root=lake.root))
        try:
            for target in range(1, 81):
                store.move_up([("q", "spare", "0", target)])
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    tailer = Lake(root=lake.root).queue("q").tailer("spare", partition="0", expendable=True)
    tailer.commit(0)
    thread = threading.Thread(target=retention)
    thread.start()
    try:
        for position in range(1, 81):
            q = tailer.queue
            q.append(pa.table({"v": [position]}), partition="0")
            tailer.commit(position)
    except BaseException as exc:  # noqa: BLE001 - reported below
        errors.append(exc)
    thread.join()
    assert errors == []
    assert PositionStore(lake).get(queue="q", tailer="spare", partition="0") == 80


def test_retention_racing_appends_on_one_handle_keeps_offsets_dense_and_rows_above_the_start(
        make_queue) -> None:
    """Threads sharing one handle: one appends 40 batches, one moves the start up behind it (as
    maintenance would). Every offset at or above the final start is there once, in order, with the
    row that was appended at it; nothing was reused."""
    import threading

    q = make_queue("q", schema=SCHEMA)
    errors: list[BaseException] = []

    def appender() -> None:
        try:
            for i in range(40):
                q.append(pa.table({"v": list(range(i * 5, i * 5 + 5))}), partition="0")
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    thread = threading.Thread(target=appender)
    thread.start()
    cuts_made = 0
    while thread.is_alive() or cuts_made == 0:
        end = q.next_offset("0")
        if end > q.start_offset("0") + 3:
            delete_below(q, {"0": end - 3})
            cuts_made += 1
    thread.join()
    assert errors == [] and cuts_made > 1
    start, end = q.start_offset("0"), q.next_offset("0")
    assert end == 200
    got = q.read_arrow(partition="0")
    assert got["_offset"].to_pylist() == list(range(start, 200))
    assert got["v"].to_pylist() == list(range(start, 200))  # value i was appended at offset i
    assert verify_log(q) == []


def churn(root: str, *, batches: range, size: int, keep: int):  # noqa: ANN201
    """Start a thread that appends batch ``i`` (values ``i*size ...``, so value v sits at offset
    v) to queue ``q`` on its own handle and moves the start up to ``keep`` offsets below the end
    after each: ``(thread, done, errors)``."""
    import threading

    from cues_platform.queues import Lake

    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        other = Lake(root=root).queue("q")
        try:
            for i in batches:
                other.append(pa.table({"v": list(range(i * size, i * size + size))}), partition="0")
                delete_below(other, {"0": other.next_offset("0") - keep})
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done, errors


def test_an_expendable_tailer_reading_while_retention_moves_the_start_never_raises(make_queue, lake) -> None:
    """A thread appends and moves the start up behind the end (as maintenance would, on another
    handle) while an expendable tailer reads: each read plans on the snapshot it took the start
    offset from, so a start moving in between is caught up (counted in ``retained_away``), never an
    OffsetOutOfRangeError (a jepsen time run once saw one). Every offset below the tailer's position
    was read once, in order, or counted as retained away."""


    q = make_queue("q", schema=SCHEMA)
    spare = q.tailer("spare", partition="0", expendable=True)
    thread, done, errors = churn(lake.root, batches=range(60), size=5, keep=2)
    read: list[int] = []
    while not done.is_set() or spare.position < q.next_offset("0"):
        read += spare.read_arrow(3)["_offset"].to_pylist()
    thread.join()
    assert errors == []
    assert spare.position == 300 and read == sorted(set(read)) and read[-1] == 299
    assert len(read) + spare.retained_away == 300


def test_read_present_returns_what_one_snapshot_holds_and_its_start(make_queue) -> None:
    """The platform's own showing and counting readers (``cues queue tail``, error counts,
    quarantine) read with ``read_present``: below the start is not an error for them, they are
    told where the start is."""
    from cues_platform.queues.reader import read_present

    q = make_queue("q", schema=SCHEMA)
    fill(q, "0", 4)
    delete_below(q, {"0": 20})
    table, first = read_present(q, partition="0", start=5, end=30)
    assert first == 20 and table["_offset"].to_pylist() == list(range(20, 30))
    table, _ = read_present(q, partition="0", start=0, newest=3, columns=["_offset", "v"])
    assert table.column_names == ["_offset", "v"] and table["v"].to_pylist() == [37, 38, 39]
    table, first = read_present(q, partition="0", start=3, end=12)  # removed entirely
    assert first == 20 and table.num_rows == 0
    with pytest.raises(OffsetOutOfRangeError):  # the reader that needs every row still raises
        q.read_arrow(partition="0", start=5, end=30)


def test_readers_of_what_is_there_never_raise_while_retention_moves_the_start(make_queue, lake) -> None:
    """A thread appends and moves the start up behind the end on another handle while ``cues
    queue tail`` and the error counts' chunked read (``dagster/error_queues.py``) run: each shows
    what one snapshot holds, in order, never an OffsetOutOfRangeError (before, each took the start
    offset and then read on a newer snapshot)."""

    from click.testing import CliRunner

    from cues_platform.cli import main
    from cues_platform.dagster.error_queues import _chunks

    q = make_queue("q", schema=SCHEMA)
    fill(q, "0", 1)
    thread, done, errors = churn(lake.root, batches=range(1, 60), size=10, keep=4)
    runner, reads = CliRunner(), 0
    while not done.is_set() or reads < 2:
        tail = runner.invoke(main, ["queue", "tail", "q", "-n", "6", "--lake", lake.root])
        assert tail.exit_code == 0 and "OffsetOutOfRange" not in tail.output, tail.output
        counted = [o for t in _chunks(q, "0", ["_offset", "v"]) for o in t["_offset"].to_pylist()]
        assert counted == sorted(set(counted))
        reads += 1
    thread.join()
    assert errors == [] and q.start_offset("0") == 596


RETAIN_CHILD = """
import sys
import pyarrow as pa
from cues_platform.queues import Lake
from cues_platform.queues.retention import delete_below
q = Lake(root=sys.argv[1]).queue("q")
print("ready", flush=True)
while True:
    q.append(pa.table({"v": [0] * 7}), partition="0")
    end = q.next_offset("0")
    delete_below(q, {"0": end - 2})
"""


@pytest.mark.parametrize("after_commits", [3, 11, 24])
def test_a_retention_sigkilled_mid_delete_leaves_a_consistent_queue(make_queue,
                                                                    after_commits) -> None:
    """SIGKILL a process that appends and cuts in a loop once the log has grown by
    ``after_commits`` entries (kills land inside deletes, rewrites and appends): the start and the
    rows agree (the full log check is clean), offsets go on densely from where they were."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.support import ROOT

    q = make_queue("q", schema=SCHEMA)
    fill(q, "0", 2)
    log = q.lake.local_path(q.uri) / "_delta_log"
    before = len(list(log.glob("*.json")))
    child = subprocess.Popen([sys.executable, "-c", RETAIN_CHILD, q.lake.root], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 120
        while len(list(log.glob("*.json"))) < before + after_commits:
            assert child.poll() is None, "the child died by itself"
            assert time.monotonic() < deadline, "the child made no progress"
            time.sleep(0.005)  # a poll with a deadline, not a timing assumption
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    q = q.lake.queue("q")
    start, end = q.start_offset("0"), q.next_offset("0")
    assert verify_log(q) == []
    assert q.read_arrow(partition="0")["_offset"].to_pylist() == list(range(start, end))
    q.append(pa.table({"v": [1]}), partition="0")
    assert q.next_offset("0") == end + 1


def test_a_file_rewritten_by_retention_reads_like_any_other(lake, spark) -> None:
    """delta-rs rewrites a straddling file with its strings as Arrow ``string_view``; reads
    (read_committed over transactional rows, Arrow and Spark) and the next age cut still work: the
    time nemesis found read_committed failing on such a file (seed 12)."""
    from cues_platform.queues import TransactionalProducer

    q = lake.create_queue("q", schema=pa.schema([("k", pa.string())]))
    owner = TransactionalProducer(lake, transactional_id="t")
    owner.init_transactions()
    for tag in "ab":
        owner.begin()
        owner.send(q, pa.table({"k": [f"{tag}{i}" for i in range(10)]}), partition="0")
        owner.commit()
    delete_below(q, {"0": 15})  # through the second transaction's file: rewritten
    fresh = lake.queue("q")
    want = [f"b{i}" for i in range(5, 10)]
    assert fresh.read_arrow(partition="0", isolation="read_committed")["k"].to_pylist() == want
    got = fresh.read_spark(spark, partition="0").orderBy("_offset").toPandas()["k"].tolist()
    assert got == want
    assert cuts(fresh, RetentionPolicy(ms=0), now_ms=clock.now_ms()) == {"0": 20}
