"""One processor over every partition of a queue (processing/lanes.py): the graph's lanes, and
exactly-once per partition through the runner, partitions added later included."""

from __future__ import annotations

import tarfile
import threading
import time

import pytest
from click.testing import CliRunner
from pyspark.sql import functions as F

from cues_platform.audit import audit
from cues_platform.cli import main
from cues_platform.processing import (
    ERROR_SCHEMA,
    Graph,
    GraphError,
    In,
    Kind,
    Options,
    Out,
    Processor,
    QueueDef,
)
from cues_platform.processing.errors import LaneMigrationError
from cues_platform.processing.history import processor_history
from cues_platform.processing.runner import GraphRunner
from cues_platform.queues import Lake
from tests.support import PAYLOAD, ROOT, rows

PARTS = ("0", "eu", "us")
FIXTURES = ROOT / "tests" / "fixtures"


def fn(ctx, **frames):
    return None


def graph(*processors: Processor, queues: list[QueueDef] | None = None) -> Graph:
    queues = queues or [QueueDef("orders", PAYLOAD, PARTS), QueueDef("enriched", PAYLOAD, PARTS),
                        QueueDef("rates", PAYLOAD), QueueDef("all", PAYLOAD),
                        QueueDef("other", PAYLOAD, ("a", "b")), QueueDef("errors", ERROR_SCHEMA)]
    return Graph.build(name="g", queues=queues, processors=list(processors), error_queue="errors")


# -- the graph -------------------------------------------------------------------------------------
def test_every_partition_binding_gives_one_lane_per_partition():
    g = graph(Processor("enrich", Kind.MAP, fn, {"o": In("orders")}, {"out": Out("enriched")}))
    assert g.families == {"enrich": ["enrich", "enrich.eu", "enrich.us"]}
    for lane, part in zip(g.lanes_of("enrich"), PARTS, strict=True):
        assert (lane.family, lane.lane) == ("enrich", part)
        assert lane.inputs["o"] == In("orders", part) and lane.outputs["out"] == Out("enriched", part)
    assert "p_enrich[enrich<br/><i>map, exactly_once, 3 partitions</i>]" in g.mermaid()


def test_a_named_partition_binding_is_read_by_every_lane_and_a_named_output_written_by_all():
    g = graph(Processor("price", Kind.JOIN, fn, {"o": In("orders"), "r": In("rates", "0")},
                        {"out": Out("all", "0")}))
    lanes = g.lanes_of("price")
    assert [(lane.inputs["o"].partition, lane.inputs["r"].partition) for lane in lanes] == [
        ("0", "0"), ("eu", "0"), ("us", "0")]
    assert {lane.outputs["out"] for lane in lanes} == {Out("all", "0")}  # one writer family


def test_a_processor_without_lanes_keeps_its_id_and_writes_partition_0():
    g = graph(Processor("one", Kind.MAP, fn, {"o": In("orders", "eu")}, {"out": Out("all")}))
    (p,) = g.processors.values()
    assert (p.id, p.family, p.lane, p.outputs["out"]) == ("one", "one", None, Out("all", "0"))


def test_inputs_that_are_not_co_partitioned_are_refused():
    with pytest.raises(GraphError, match=r"inputs 'o' \(queue 'orders', partitions \['0', 'eu', 'us'\]\) "
                                         r"and 'x' \(queue 'other', partitions \['a', 'b'\]\) are not "
                                         r"co-partitioned") as info:
        graph(Processor("j", Kind.JOIN, fn, {"o": In("orders"), "x": In("other")}, {"out": Out("all")}))
    assert (info.value.processor, info.value.binding) == ("j", "x")


def test_an_output_without_the_lanes_partition_is_refused():
    with pytest.raises(GraphError, match=r"output 'out' writes the partition of each lane to queue 'all', "
                                         r"which does not declare partition 'eu'.*Out\('all', '0'\)"):
        graph(Processor("m", Kind.MAP, fn, {"o": In("orders")}, {"out": Out("all")}))


def test_two_processors_still_may_not_write_one_partition():
    with pytest.raises(GraphError, match="which processor 'a' already writes"):
        graph(Processor("a", Kind.MAP, fn, {"o": In("orders")}, {"out": Out("all", "0")}),
              Processor("b", Kind.MAP, fn, {"r": In("rates")}, {"out": Out("all", "0")}))


def test_lane_ids_are_safe_folder_names():
    g = graph(Processor("enrich", Kind.MAP, fn, {"o": In("orders")}, {"out": Out("enriched")}))
    for pid in g.processors:
        assert "/" not in pid and ".." not in pid


# -- the runner --------------------------------------------------------------------------------------
def double(ctx, o):
    return o.select((F.col("id") * 2).alias("id"), F.col("note"))


def shop(batch: int = 4) -> Graph:
    return graph(Processor("enrich", Kind.MAP, double, {"o": In("orders")}, {"out": Out("enriched")},
                           options=Options(batch_size=batch)))


def ids(lake: Lake, queue: str, part: str) -> list[int]:
    t = lake.queue(queue).read_arrow(partition=part)
    return t.sort_by("_offset")["id"].to_pylist()


def test_each_partition_is_processed_exactly_once_by_its_own_lane(spark, lake):
    runner = GraphRunner(graph=shop(), lake=lake, spark=spark)
    orders = lake.queue("orders")
    for i, part in enumerate(PARTS):
        orders.append(rows(100 * i, 10), partition=part)
    runner.run_until_idle()
    for i, part in enumerate(PARTS):
        assert ids(lake, "enriched", part) == [2 * (100 * i + k) for k in range(10)]
    assert sorted(runner.stats) == ["enrich", "enrich.eu", "enrich.us"]
    assert all(runner.stats[pid].steps == 3 for pid in runner.stats)  # 10 rows, batches of 4
    hashes = set()
    for pid in runner.stats:  # steps, snapshots and hashes of its own
        history = processor_history(lake, pid)
        assert [r.step for r in history] == [0, 1, 2]
        hashes |= {r.hash for r in history}
    assert len(hashes) == 9
    report = audit(lake, graph=runner.graph)
    assert report.ok, report.to_text()
    assert sorted(report.processors) == ["enrich", "enrich.eu", "enrich.us"]
    # `cues backing show enrich`: each lane in turn
    shown = CliRunner().invoke(main, ["backing", "show", "enrich", "--lake", lake.root])
    assert shown.exit_code == 0, shown.output
    headers = [line for line in shown.output.splitlines() if line.startswith("lane ")]
    assert headers == ["lane enrich (partition 0):", "lane enrich.eu (partition eu):",
                       "lane enrich.us (partition us):"]
    assert "  step 2: reads orders/eu [8, 10)" in shown.output


def wait_for(predicate, what: str, *, runner: GraphRunner, thread: threading.Thread,
             failure: list[BaseException], timeout: float = 120) -> None:
    """Polls ``predicate`` until it holds; fails at the deadline, or at once if the runner's
    thread ended (its exception, if any, in the message)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert thread.is_alive(), f"the runner stopped before {what}: {failure!r}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        runner.stop_event.wait(0.05)  # returns at once if the runner was stopped


def test_a_partition_added_later_gets_its_lane(spark, lake):
    """A partition added while ``run()`` runs (in a thread of this process): the runner's own
    periodic lane refresh (every ``lane_refresh`` seconds; 5 s by default) adds the lane, emits
    ``lane_added`` once, the output queue gains the partition and the new rows are delivered
    once; a restart over the declared graph finds the same lane and delivers nothing twice."""
    events: list[tuple[str, dict]] = []
    runner = GraphRunner(graph=shop(), lake=lake, spark=spark, lane_refresh=0.5,
                         events=lambda event, fields: events.append((event, fields)))
    orders = lake.queue("orders")
    orders.append(rows(0, 3), partition="eu")
    failure: list[BaseException] = []

    def run() -> None:
        try:
            runner.run(show_progress=False, idle_exit=300)  # the bound if the test never stops it
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread, which fails on it
            failure.append(exc)

    thread = threading.Thread(target=run, name="runner", daemon=True)
    thread.start()
    try:
        polls = {"runner": runner, "thread": thread, "failure": failure}
        wait_for(lambda: any(e == "idle" for e, _ in events), "the first rows delivered", **polls)
        assert ids(lake, "enriched", "eu") == [0, 2, 4]
        assert "enrich.asia" not in runner.steppers and not [e for e, _ in events if e.startswith("lane_")]
        orders.add_partitions(["asia"])  # while the runner runs: no call into it from here on
        orders.append(rows(500, 5), partition="asia")
        wait_for(lambda: any(e == "lane_added" for e, _ in events), "lane_added", **polls)
        wait_for(lambda: "asia" in lake.queue("enriched").partitions
                 and len(ids(lake, "enriched", "asia")) >= 5, "the rows of asia delivered", **polls)
    finally:
        runner.stop_event.set()
        thread.join(timeout=120)
    assert not thread.is_alive() and not failure, failure
    assert [f for e, f in events if e == "lane_added"] == [
        {"processor": "enrich.asia", "family": "enrich", "partition": "asia"}]
    assert "lane_refused" not in [e for e, _ in events] and "enrich.asia" in runner.steppers
    assert [f["processor"] for e, f in events if e == "step"].count("enrich.asia") == 2  # batch 4: 4 + 1
    assert lake.queue("enriched").partitions == (*PARTS, "asia")  # the output gained it too
    assert ids(lake, "enriched", "asia") == [1000, 1002, 1004, 1006, 1008]  # each once
    # a new runner (a restart) over the declared graph finds the lane again and delivers nothing twice
    again = GraphRunner(graph=shop(), lake=Lake(root=lake.root), spark=spark)
    again.run_until_idle()
    assert "enrich.asia" in again.steppers
    assert ids(lake, "enriched", "asia") == [1000, 1002, 1004, 1006, 1008]
    assert ids(lake, "enriched", "eu") == [0, 2, 4]
    report = audit(lake, graph=again.graph)
    assert report.ok, report.to_text()


def test_a_lake_written_before_lanes_is_continued_by_every_partition(spark, tmp_path):
    """Migration: tests/fixtures/pre_lanes_lake.tar.gz was written by the code before lanes
    (commit a0ffb93; tests/fixtures/make_pre_lanes_lake.py): ``enrich`` read partition "0"
    explicitly, 3 steps, its positions keyed by binding name (``pos:enrich:o``). Reading every partition now, its lane of partition "0" is the same
    processor (same id, backing queue and positions): it goes on at step 3 and delivers nothing
    twice; partition "eu" gets a new lane that starts at offset 0."""
    with tarfile.open(FIXTURES / "pre_lanes_lake.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    lake = Lake(root=str(tmp_path / "lake"))
    assert ids(lake, "enriched", "0") == [2 * k for k in range(10)]  # what the old code wrote
    graph = Graph.build(
        name="shop",
        queues=[QueueDef("orders", PAYLOAD, ("0", "eu")), QueueDef("enriched", PAYLOAD, ("0", "eu")),
                QueueDef("errors", ERROR_SCHEMA)],
        processors=[Processor("enrich", Kind.MAP, double, {"o": In("orders")}, {"out": Out("enriched")},
                              options=Options(batch_size=4))],
        error_queue="errors")
    lake.queue("orders").append(rows(10, 2), partition="0")
    home = lake.queue("enriched")
    assert home.refresh().transaction_version("pos:enrich:o") == 10  # keyed by binding, then
    assert home.refresh().transaction_version("pos:enrich:orders/0") is None
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    runner.run_until_idle()
    assert ids(lake, "enriched", "0") == [2 * k for k in range(12)]
    # recovery migrated the binding-keyed position once, to the partition its last step read
    migrated = [e for e in home.refresh().history() if e.get("cues.migrated") == "positions"]
    assert len(migrated) == 1 and home.refresh().transaction_version("pos:enrich:orders/0") == 12
    assert ids(lake, "enriched", "eu") == [2 * k for k in range(100, 105)]
    assert [r.step for r in processor_history(lake, "enrich")] == [0, 1, 2, 3]
    assert [r.step for r in processor_history(lake, "enrich.eu")] == [0, 1]
    report = audit(lake, graph=graph)
    assert report.ok, report.to_text()


def test_a_processor_that_read_named_partitions_is_not_silently_restarted_as_lanes(spark, lake):
    """An alts over orders/eu and orders/us rewritten as one map over every partition: lanes
    enrich.eu and enrich.us would start at offset 0 and deliver again. The runner refuses before
    any step, naming what was read and the way out; the lake is unchanged."""
    old = graph(Processor("enrich", Kind.ALTS, lambda ctx, eu, us: (eu if ctx.inputs["eu"].size else us),
                          {"eu": In("orders", "eu"), "us": In("orders", "us")}, {"out": Out("all", "0")}))
    GraphRunner(graph=old, lake=lake, spark=spark)
    lake.queue("orders").append(rows(0, 3), partition="eu")
    GraphRunner(graph=old, lake=lake, spark=spark).run_until_idle()
    before = lake.queue("all").count()
    new = graph(Processor("enrich", Kind.MAP, fn, {"o": In("orders")}, {"out": Out("all", "0")}))
    with pytest.raises(LaneMigrationError, match=r"'enrich.eu' would read orders/eu \(read by enrich up "
                                                 r"to offset 3\).*fresh lake.*cues processor forget enrich") as info:
        GraphRunner(graph=new, lake=lake, spark=spark)
    assert info.value.processor == "enrich.eu" and info.value.owners == ["enrich"]
    assert lake.queue("all").count() == before == 3


@pytest.mark.parametrize("workers", [1, 3])
def test_lanes_writing_one_partition_at_the_same_time_keep_offsets_dense(spark, lake, workers):
    """Three lanes writing the one partition "0" of ``all``, in turn (1) or at the same time (3
    threads): every row once, offsets 0..n-1 with no gap or repeat (the queue layer's app
    transaction conflict makes concurrent commits to one partition retry), each step's rows under
    its own hash."""
    g = graph(Processor("merge", Kind.MAP, double, {"o": In("orders")}, {"out": Out("all", "0")},
                        options=Options(batch_size=2, lane_workers=workers)))
    runner = GraphRunner(graph=g, lake=lake, spark=spark)
    for i, part in enumerate(PARTS):
        lake.queue("orders").append(rows(100 * i, 10), partition=part)
    runner.run_until_idle()
    out = lake.queue("all").read_arrow(partition="0")
    assert sorted(out["_offset"].to_pylist()) == list(range(30))
    assert sorted(out["id"].to_pylist()) == sorted(2 * (100 * i + k) for i in range(3) for k in range(10))
    hashes = {r.hash for pid in g.processors for r in processor_history(lake, pid)}
    assert len(hashes) == 15 and set(out["_delivery_hash"].to_pylist()) == hashes
    assert audit(lake, graph=g).ok


def union(ctx, left, right):
    return left.unionByName(right)


def test_a_partition_added_to_one_side_of_a_join_waits_for_the_other_in_a_running_runner(spark, lake):
    """Issue 22 item 5: a partition added to one input of a join of two every-partition inputs
    made the running runner die of GraphError (not co-partitioned) in its periodic lane refresh.
    Now ``run()`` (its periodic refresh every 0 s, the events driving the test: no sleeping)
    keeps stepping the existing lanes, says once that left/asia waits for right, and adds the
    lane once right has asia too."""
    sides = ("0", "eu")
    g = graph(Processor("j", Kind.JOIN, union, {"left": In("left"), "right": In("right")},
                        {"out": Out("joined")}, options=Options(batch_size=100)),
              queues=[QueueDef("left", PAYLOAD, sides), QueueDef("right", PAYLOAD, sides),
                      QueueDef("joined", PAYLOAD, sides), QueueDef("errors", ERROR_SCHEMA)])
    events: list[tuple[str, dict]] = []
    stage = {"now": "start"}

    def driver(event: str, fields: dict) -> None:
        events.append((event, fields))
        if event == "idle" and stage["now"] == "start":  # the first rows are processed
            stage["now"] = "left added"
            lake.queue("left").add_partitions(["asia"])
            lake.queue("left").append(rows(500, 2), partition="asia")
        elif event == "lane_waiting":
            stage["now"] = "waiting"
            lake.queue("left").append(rows(10, 1), partition="0")  # work for an existing lane
            lake.queue("right").append(rows(110, 1), partition="0")  # (a join waits for both)
        elif event == "step" and fields["processor"] == "j" and stage["now"] == "waiting":
            stage["now"] = "right added"  # the runner kept stepping while asia waited
            lake.queue("right").add_partitions(["asia"])
            lake.queue("right").append(rows(600, 3), partition="asia")
        elif event == "step" and fields["processor"] == "j.asia":
            stage["now"] = "done"
            runner.stop_event.set()

    runner = GraphRunner(graph=g, lake=lake, spark=spark, events=driver, lane_refresh=0.0)
    lake.queue("left").append(rows(0, 2), partition="0")
    lake.queue("right").append(rows(100, 2), partition="0")
    runner.run(show_progress=False, idle_exit=120)  # the bound if a stage never comes

    assert stage["now"] == "done", [e for e, _ in events]
    names = [e for e, _ in events]
    waiting = [f for e, f in events if e == "lane_waiting"]
    assert waiting == [{"family": "j", "queue": "left", "partition": "asia", "waits_for": ["right"],
                        "message": waiting[0]["message"]}]  # once, though refreshed every pass
    assert ("partition 'asia' of queue 'left' waits for its co-partition in queue 'right'"
            in waiting[0]["message"])
    assert [f for e, f in events if e == "lane_added"] == [
        {"processor": "j.asia", "family": "j", "partition": "asia"}]
    assert "lane_refused" not in names and "failed" not in names
    i_wait, i_added = names.index("lane_waiting"), names.index("lane_added")
    assert any(e == "step" and f["processor"] == "j" for e, f in events[i_wait:i_added])
    assert sorted(ids(lake, "joined", "asia")) == [500, 501, 600, 601, 602]
    assert sorted(ids(lake, "joined", "0")) == [0, 1, 10, 100, 101, 110]
    assert lake.queue("joined").partitions == (*sides, "asia")
    report = audit(lake, graph=runner.graph)
    assert report.ok, report.to_text()
