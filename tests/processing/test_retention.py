"""Retention never removes what a reader still needs (processing/retention.py): the low-water mark
of every partition is the minimum of every processor lane's position, every tailer's committed
position that is not expendable, and the first offset of an open transaction; time (the
platform's clock, however skewed) only chooses among rows every reader has passed."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cues_platform import clock
from cues_platform.cli import main
from cues_platform.processing import (
    ERROR_SCHEMA,
    Graph,
    GraphRunner,
    In,
    Kind,
    Options,
    Out,
    Processor,
    QueueDef,
)
from cues_platform.processing.retention import low_water_marks, retain
from cues_platform.queues import TransactionalProducer
from cues_platform.queues.retention import set_policy
from tests.support import PAYLOAD, rows

DAY_MS = 86_400_000


@pytest.fixture(autouse=True)
def _real_clock():
    yield
    clock.reset()


def copy(ctx, **frames):
    (frame,) = frames.values()
    return frame


def graph(*pids: str) -> Graph:
    return Graph.build(
        name="g",
        queues=[QueueDef("a", PAYLOAD), QueueDef("b", PAYLOAD), QueueDef("c", PAYLOAD),
                QueueDef("errors", ERROR_SCHEMA)],
        processors=[Processor(pid, Kind.MAP, copy, {"src": In("a", "0")},
                              {"out": Out(out, "0")}, options=Options(batch_size=1_000))
                    for pid, out in (("p", "b"), ("r", "c")) if pid in pids],
        error_queue="errors")


def ids(lake, queue: str) -> list[int]:
    return sorted(lake.queue(queue).read_arrow(partition="0")["id"].to_pylist())


def p_read_30(lake, spark):
    """Graph ``p`` (a/0 -> b) deployed, 30 rows appended to a/0 and read by p."""
    g = graph("p")
    GraphRunner(graph=g, lake=lake, spark=spark)
    a = lake.queue("a")
    a.append(rows(0, 30), partition="0")
    GraphRunner(graph=g, lake=lake, spark=spark).run_until_idle()
    return g, a


def test_a_processor_lane_holds_retention_at_its_position_whatever_the_clock(spark, lake) -> None:
    """p read a/0 up to 30; 20 more rows wait. A week's retention on a clock a month ahead (an
    owner idle for a month), then a year ahead (a skewed clock): the start goes to 30, never past."""
    g, a = p_read_30(lake, spark)
    a.append(rows(30, 20), partition="0")
    set_policy(a, ms=7 * DAY_MS, bytes=None)
    assert retain(a).partitions[0].new_start == 0  # nothing is a week old yet
    clock.advance(seconds=30 * 86_400)
    report = retain(a)
    (part,) = report.partitions
    assert (part.old_start, part.new_start, part.low_water.offset) == (0, 30, 30)
    assert "processor 'p'" in part.low_water.holder
    clock.advance(seconds=365 * 86_400)
    assert retain(a).partitions[0].new_start == 30  # the 20 unread rows stay
    assert a.read_arrow(partition="0")["id"].to_pylist() == list(range(30, 50))
    # the owner comes back: it goes on exactly where it was, nothing lost, nothing twice
    GraphRunner(graph=g, lake=lake, spark=spark).run_until_idle()
    assert ids(lake, "b") == list(range(50))
    assert retain(a).partitions[0].new_start == 50


def test_a_processor_deployed_after_retention_starts_at_the_start_offset(spark, lake) -> None:
    g, a = p_read_30(lake, spark)
    set_policy(a, ms=0, bytes=None)
    assert retain(a).partitions[0].new_start == 30
    a.append(rows(30, 5), partition="0")
    # r is new: registered now, it holds the start (not 0) and reads from there
    GraphRunner(graph=graph("p", "r"), lake=lake, spark=spark).run_until_idle()
    assert ids(lake, "c") == list(range(30, 35))
    assert ids(lake, "b") == list(range(35))


def test_a_registered_lane_that_never_read_holds_everything(spark, lake) -> None:
    """r is in the registry (its graph started) but never stepped: retention keeps every row."""
    from cues_platform.processing.deployments import check_and_record

    g, a = p_read_30(lake, spark)
    check_and_record(graph("p", "r"), lake)  # deployed, not run yet
    set_policy(a, ms=0, bytes=None)
    (part,) = retain(a).partitions
    assert part.new_start == 0 and "processor 'r'" in part.low_water.holder


def test_tailers_hold_unless_expendable_and_an_expendable_one_is_moved_and_told(make_queue) -> None:
    q = make_queue("t")
    q.append(rows(0, 40), partition="0")
    keeper = q.tailer("keeper", partition="0")
    keeper.read_arrow(25)
    keeper.commit()
    spare = q.tailer("spare", partition="0", expendable=True)
    spare.read_arrow(5)
    spare.commit()
    set_policy(q, ms=0, bytes=None)
    report = retain(q)
    (part,) = report.partitions
    assert (part.new_start, part.low_water.holder) == (25, "tailer 'keeper'")
    assert report.moved_tailers == [("spare", "0", 5, 25)]
    assert spare.read_arrow(3)["id"].to_pylist() == [25, 26, 27]
    assert spare.retained_away == 20
    again = q.tailer("spare", partition="0", expendable=True)  # a new instance: moved durably
    assert again.position == 25


def test_an_open_transaction_holds_retention_below_its_first_row(make_queue, lake) -> None:
    q = make_queue("t")
    q.append(rows(0, 10), partition="0")
    owner = TransactionalProducer(lake, transactional_id="slow", timeout=3600.0)
    owner.init_transactions()
    owner.begin()
    owner.send(q, rows(10, 5), partition="0")  # offsets 10..14, undecided
    q.append(rows(15, 5), partition="0")
    set_policy(q, ms=0, bytes=None)
    holds, _ = low_water_marks(q)
    assert (holds["0"].offset, holds["0"].holder) == (10, "open transaction")
    assert retain(q).partitions[0].new_start == 10
    owner.commit()
    assert retain(q).partitions[0].new_start == 20
    assert q.read_arrow(partition="0").num_rows == 0


def test_the_retention_command_sets_shows_and_maintain_applies_it(make_queue, lake) -> None:
    q = make_queue("t")
    q.append(rows(0, 10), partition="0")
    q.tailer("keeper", partition="0").commit(4)
    runner = CliRunner()
    root = ["--lake", lake.root]
    shown = runner.invoke(main, ["queue", "retention", "t", *root])
    assert shown.exit_code == 0, shown.output
    assert "keep every message (no retention)" in shown.output
    set_ = runner.invoke(main, ["queue", "retention", "t", "--days", "7", "--bytes", "1000000",
                                *root])
    assert set_.exit_code == 0, set_.output
    assert "604800000 ms (7 days) and 1000000 bytes per partition" in set_.output
    bad = runner.invoke(main, ["queue", "retention", "t", "--days", "7", "--ms", "5", *root])
    assert bad.exit_code == 2 and "give the age once" in bad.output
    clock.advance(seconds=8 * 86_400)
    done = runner.invoke(main, ["queue", "maintain", "t", *root])
    assert done.exit_code == 0, done.output
    assert "partition 0: start 0 -> 4 (next offset 10; readers need from 4: tailer 'keeper')" in done.output
    assert lake.queue("t").start_offset("0") == 4


def test_the_busy_system_tables_are_compacted_and_keep_every_position(make_queue, lake) -> None:
    """A year of tailer commits is a file per commit in `_cues/positions`: maintenance merges them
    (every row and every position stays), so opening the table no longer reads a file per commit."""
    from deltalake import DeltaTable

    from cues_platform.processing.retention import maintain_system_tables
    from cues_platform.queues.positions import PositionStore

    q = make_queue("t")
    q.append(rows(0, 200), partition="0")
    for name in ("a", "b"):
        tailer = q.tailer(name, partition="0", expendable=name == "b")
        for _ in range(60):
            tailer.read_arrow(1)
            tailer.commit()
    uri = lake.system_uri("positions")
    before = DeltaTable(uri).to_pyarrow_table().num_rows
    assert len(DeltaTable(uri).file_uris()) == 120
    assert maintain_system_tables(lake) == {"positions": 120}  # no coordinator table yet
    assert len(DeltaTable(uri).file_uris()) == 1
    assert DeltaTable(uri).to_pyarrow_table().num_rows == before
    assert [(t.tailer, t.position, t.expendable) for t in PositionStore(lake).tailers("t")] == [
        ("a", 60, False), ("b", 60, True)]
    assert q.tailer("a", partition="0").position == 60
