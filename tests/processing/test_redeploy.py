"""A graph changed between runs (processing/deployments.py): every change is continued exactly
once or refused before any step with the typed error naming the change and the ways out.

The first two tests are the review's reproductions (issue 22, item 1): positions were keyed by
the binding's name, so redeploying ``In("a")`` as ``In("a", "x")`` applied partition 0's position
to partition x (20 rows never delivered, or 20 delivered twice) and ``cues audit`` said OK."""

from __future__ import annotations

import pytest

from cues_platform.audit import audit
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
    Strategy,
)
from cues_platform.processing.deployments import Registry, forget
from cues_platform.processing.errors import (
    HomeChangedError,
    LaneMigrationError,
    ProcessorRenamedError,
    StepInFlightError,
    StrategyChangedError,
)
from cues_platform.queues.layout import LANE_POSITION, LEGACY_LANE_POSITION
from tests.support import PAYLOAD, rows

PARTS = ("0", "x")


def copy(ctx, **frames):
    (frame,) = frames.values()
    return frame


def join_first(ctx, src, extra):
    return src


def graph(*processors: Processor) -> Graph:
    return Graph.build(
        name="g",
        queues=[QueueDef("a", PAYLOAD, PARTS), QueueDef("b", PAYLOAD, PARTS), QueueDef("c", PAYLOAD, PARTS),
                QueueDef("rates", PAYLOAD), QueueDef("errors", ERROR_SCHEMA)],
        processors=list(processors), error_queue="errors")


def mapper(src: In, out: Out | None = None, *, pid: str = "p", binding: str = "src",
           strategy: Strategy = Strategy.EXACTLY_ONCE) -> Processor:
    return Processor(pid, Kind.MAP, copy, {binding: src}, {"out": out or Out("b", "0")},
                     options=Options(batch_size=1_000, strategy=strategy))


def ids(lake, queue: str = "b") -> list[int]:
    q = lake.queue(queue)
    return sorted(i for p in q.partitions for i in q.read_arrow(partition=p)["id"].to_pylist())


def run(lake, spark, g: Graph) -> None:
    GraphRunner(graph=g, lake=lake, spark=spark).run_until_idle()


def deliver(lake, spark, g: Graph, feed: dict[str, tuple[int, int]]) -> None:
    """Run ``g`` once (its queues created), append ``feed`` ({partition: (first id, count)}) to
    queue ``a`` and run it until idle."""
    GraphRunner(graph=g, lake=lake, spark=spark)
    for part, (first, count) in feed.items():
        lake.queue("a").append(rows(first, count), partition=part)
    run(lake, spark, g)


def lanes_then(lake, spark, *, zero: int, x: int) -> None:
    """Lanes p (a/0) and p.x (a/x) of ``In("a")`` deliver ``zero`` and ``x`` rows."""
    g = graph(mapper(In("a")))
    GraphRunner(graph=g, lake=lake, spark=spark)  # creates the queues
    lake.queue("a").append(rows(0, zero), partition="0")
    lake.queue("a").append(rows(1_000, x), partition="x")
    run(lake, spark, g)
    assert len(ids(lake)) == zero + x


@pytest.mark.parametrize(("zero", "x"), [(30, 10), (10, 30)])
def test_every_partition_redeployed_as_a_named_partition_is_refused(spark, lake, zero, x):
    """The reproduction: lane p delivered a/0 [0, zero), lane p.x a/x [0, x); ``p`` redeployed as
    ``In("a", "x")`` read a/x from p's position on a/0 (30: 20 rows skipped; 10: 20 rows twice).
    Now p has no position on a/x, and p.x, which read it, no longer does: refused, nothing written."""
    lanes_then(lake, spark, zero=zero, x=x)
    lake.queue("a").append(rows(1_000 + x, 20), partition="x")
    before = lake.queue("b").version()
    with pytest.raises(LaneMigrationError, match=rf"processor 'p' would read a/x \(read by p.x up to offset "
                                                 rf"{x}\).*cues processor forget p.x") as info:
        GraphRunner(graph=graph(mapper(In("a", "x"))), lake=lake, spark=spark)
    assert (info.value.processor, info.value.pairs, info.value.owners) == ("p", ["a/x"], ["p.x"])
    assert lake.queue("b").version() == before
    # the old graph still goes on exactly once
    run(lake, spark, graph(mapper(In("a"))))
    assert ids(lake) == sorted([*range(zero), *range(1_000, 1_000 + x + 20)])
    assert audit(lake).ok


def test_a_named_partition_redeployed_as_every_partition_is_refused(spark, lake):
    """``p`` read a/x by name; as ``In("a")`` its lane p.x would start a/x at 0 again."""
    deliver(lake, spark, graph(mapper(In("a", "x"))), {"x": (0, 10)})
    with pytest.raises(LaneMigrationError, match=r"processor 'p.x' would read a/x \(read by p up to offset 10\)"):
        GraphRunner(graph=graph(mapper(In("a"))), lake=lake, spark=spark)
    assert ids(lake) == list(range(10))


def test_a_named_partition_moved_to_another_is_read_from_its_start(spark, lake):
    """``In("a", "0")`` -> ``In("a", "x")``: p never read a/x, so it starts there at 0 (with
    binding-keyed positions it started at a/0's 30: 30 rows of a/x never delivered)."""
    g = graph(mapper(In("a", "0")))
    GraphRunner(graph=g, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 30), partition="0")
    lake.queue("a").append(rows(1_000, 40), partition="x")
    run(lake, spark, g)
    run(lake, spark, graph(mapper(In("a", "x"))))
    assert ids(lake) == sorted([*range(30), *range(1_000, 1_040)])
    # and back: p goes on at a/0 where it stopped (its own position), nothing twice
    lake.queue("a").append(rows(30, 5), partition="0")
    run(lake, spark, graph(mapper(In("a", "0"))))
    assert ids(lake) == sorted([*range(35), *range(1_000, 1_040)])
    report = audit(lake)
    assert report.ok, report.to_text()


def test_a_renamed_binding_and_an_added_and_removed_input_continue(spark, lake):
    """Positions are keyed by what is read: renaming the binding keeps the position; an added
    input (a join with ``c``) starts ``c`` at 0; removing it again keeps ``a``'s position."""
    deliver(lake, spark, graph(mapper(In("a", "0"))), {"0": (0, 10)})
    run(lake, spark, graph(mapper(In("a", "0"), binding="renamed")))
    lake.queue("a").append(rows(10, 5), partition="0")
    lake.queue("c").append(rows(500, 3), partition="0")
    joined = Processor("p", Kind.JOIN, join_first, {"src": In("a", "0"), "extra": In("c", "0")},
                       {"out": Out("b", "0")}, options=Options(batch_size=1_000))
    run(lake, spark, graph(joined))
    assert ids(lake) == list(range(15))  # a/0 [10, 15) once, joined with c/0 [0, 3)
    home = lake.queue("b").refresh()
    assert home.transaction_version(LANE_POSITION.id("p", "c", "0")) == 3
    lake.queue("a").append(rows(15, 5), partition="0")
    run(lake, spark, graph(mapper(In("a", "0"))))
    assert ids(lake) == list(range(20))
    assert audit(lake).ok


def test_another_queue_under_the_same_binding_name_starts_at_its_beginning(spark, lake):
    g = graph(mapper(In("a", "0")))
    GraphRunner(graph=g, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 30), partition="0")
    lake.queue("c").append(rows(1_000, 10), partition="0")
    run(lake, spark, g)
    run(lake, spark, graph(mapper(In("c", "0"))))  # binding "src" now names queue c
    assert ids(lake) == sorted([*range(30), *range(1_000, 1_010)])


def test_a_renamed_processor_is_refused_and_forget_is_the_way_to_start_over(spark, lake):
    deliver(lake, spark, graph(mapper(In("a", "0"))), {"0": (0, 10)})
    with pytest.raises(ProcessorRenamedError, match=r"processor 'q' is new to this lake, but processor 'p'.*"
                                                    r"keep the id 'p'.*cues processor forget p") as info:
        GraphRunner(graph=graph(mapper(In("a", "0"), pid="q")), lake=lake, spark=spark)
    assert info.value.before == "p"
    assert ids(lake) == list(range(10))
    assert forget(lake, "p")  # the operator's decision: deliver again under the new id
    run(lake, spark, graph(mapper(In("a", "0"), pid="q")))
    assert ids(lake) == sorted([*range(10), *range(10)])


def test_a_changed_strategy_is_refused_after_progress(spark, lake):
    deliver(lake, spark, graph(mapper(In("a", "0"))), {"0": (0, 10)})
    with pytest.raises(StrategyChangedError, match=r"ran exactly_once and is now at_least_once"):
        GraphRunner(graph=graph(mapper(In("a", "0"), strategy=Strategy.AT_LEAST_ONCE)), lake=lake, spark=spark)
    # the other way too: at_least_once's positions are tailer positions, not in a home queue
    other = graph(mapper(In("a", "x"), pid="r", out=Out("c", "0"), strategy=Strategy.AT_LEAST_ONCE))
    GraphRunner(graph=other, lake=lake, spark=spark)
    lake.queue("a").append(rows(100, 4), partition="x")
    run(lake, spark, other)
    with pytest.raises(StrategyChangedError, match=r"'r' ran at_least_once and is now exactly_once"):
        GraphRunner(graph=graph(mapper(In("a", "x"), pid="r", out=Out("c", "0"))), lake=lake, spark=spark)


def test_a_changed_home_queue_is_refused(spark, lake):
    deliver(lake, spark, graph(mapper(In("a", "0"))), {"0": (0, 10)})
    with pytest.raises(HomeChangedError, match=r"first output's queue 'b', but its first output is now 'c'"):
        GraphRunner(graph=graph(mapper(In("a", "0"), out=Out("c", "0"))), lake=lake, spark=spark)
    assert lake.queue("c").count() == 0


def test_a_broadcast_side_is_read_whole_by_a_lane_added_later(spark, lake):
    """Every lane reads rates/0 with a position of its own: a new partition's lane reads it from
    0 and that is no move of a position (rates/0 is still read by the other lanes)."""
    def priced(ctx, src, r):
        return src

    def g() -> Graph:
        return graph(Processor("p", Kind.JOIN, priced, {"src": In("a"), "r": In("rates", "0")},
                               {"out": Out("b", "0")}))
    GraphRunner(graph=g(), lake=lake, spark=spark)
    lake.queue("rates").append(rows(0, 2), partition="0")
    lake.queue("a").append(rows(0, 3), partition="0")
    run(lake, spark, g())
    lake.queue("a").add_partitions(["y"])
    lake.queue("b").add_partitions(["y"])
    lake.queue("a").append(rows(700, 3), partition="y")
    run(lake, spark, g().with_lake_partitions({"a": ("0", "x", "y"), "b": ("0", "x", "y")}))
    assert ids(lake) == sorted([*range(3), *range(700, 703)])
    assert Registry(lake).shapes()["p.y"].reads == {("a", "y"), ("rates", "0")}


def test_a_step_in_flight_under_other_bindings_is_finished_first(spark, lake):
    """A sink records its snapshot before its function: crashed there, its retry must read the
    same ranges with the same bindings, so a graph that renamed the binding is refused until the
    previous graph finished the step."""
    def sink(ctx, **frames):
        raise KeyboardInterrupt  # a crash after the snapshot record (not a handled error)

    def quiet(ctx, **frames):
        return None

    def g(fn, binding="src") -> Graph:
        return graph(Processor("s", Kind.SINK, fn, {binding: In("a", "0")}, {}))
    GraphRunner(graph=g(sink), lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 3), partition="0")
    with pytest.raises(KeyboardInterrupt):
        run(lake, spark, g(sink))
    with pytest.raises(StepInFlightError, match=r"run the previous graph until idle"):
        run(lake, spark, g(quiet, binding="renamed"))
    run(lake, spark, g(quiet))  # the step is finished by the bindings that began it
    run(lake, spark, g(quiet, binding="renamed"))


def test_a_step_stores_its_position_under_the_queue_partition_it_read(spark, lake):
    """Not under the binding's name (``pos:{p}:{binding}``, which a redeploy could point at
    another partition; lakes that have it are migrated: test_lanes.py's pre-lanes lake)."""
    deliver(lake, spark, graph(mapper(In("a", "0"))), {"0": (0, 10)})
    home = lake.queue("b")
    assert home.refresh().transaction_version(LEGACY_LANE_POSITION.id("p", "src")) is None
    assert home.refresh().transaction_version(LANE_POSITION.id("p", "a", "0")) == 10


def test_cues_processor_ls_and_forget(spark, lake):
    """The way out the errors name, as an operator runs it: ``cues processor forget ID`` refuses
    without ``--yes`` and then forgets the id, after which the refused graph runs."""
    from click.testing import CliRunner

    from cues_platform.cli import main

    lanes_then(lake, spark, zero=3, x=2)
    cli = CliRunner()
    listed = cli.invoke(main, ["processor", "ls", "--lake", lake.root])
    assert listed.exit_code == 0 and "p.x" in listed.output and "src=a/x" in listed.output
    refused = cli.invoke(main, ["processor", "forget", "p.x", "--lake", lake.root])
    assert refused.exit_code == 2 and "pass --yes" in refused.output
    done = cli.invoke(main, ["processor", "forget", "p.x", "--yes", "--lake", lake.root])
    assert done.exit_code == 0 and "forgot p.x" in done.output
    run(lake, spark, graph(mapper(In("a", "x"))))  # on purpose: a/x is delivered again by p
    assert ids(lake) == sorted([*range(3), 1_000, 1_001, 1_000, 1_001])


def test_cues_queue_maintain_keeps_an_idle_processors_step_records(spark, lake):
    """``cues queue maintain`` drops log entries older than the retention by the local clock: on
    a home queue it digests every processor's step commits first, so a processor idle for longer
    than the retention (here: a retention of 0 hours) loses no step record."""
    from click.testing import CliRunner

    from cues_platform.cli import main
    from cues_platform.processing.history import log_records, processor_history

    g = graph(mapper(In("a", "0"), pid="quiet"))
    GraphRunner(graph=g, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 3), partition="0")
    run(lake, spark, g)
    home = lake.queue("b")
    home.refresh().alter.set_table_properties({"delta.logRetentionDuration": "interval 0 hours",
                                               "delta.checkpointInterval": "2"})
    from cues_platform.processing.home import fence_home

    for i in range(3):  # newer (empty) commits, so quiet's step commit lies below the checkpoint
        assert fence_home(home, f"other{i}", 0) is None
    result = CliRunner().invoke(main, ["queue", "maintain", "b", "--lake", lake.root])
    assert result.exit_code == 0, result.output
    assert log_records(lake.queue("b"))[0] == {}  # its log entry is gone ...
    assert [r.step for r in processor_history(lake, "quiet") if r.is_attempt] == [0]  # ... its record not
    assert audit(lake).ok
