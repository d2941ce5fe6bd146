"""Step digests: the one-commit steps' records survive the trimming of their home queue's Delta log
(the auditor reads them from the home's digest queue, ``history.HomeDigests``), a digest holds
every processor's steps in a shared home (lanes), and a digest changes nothing recovery reads."""

from __future__ import annotations

from dataclasses import replace

from deltalake import DeltaTable

from cues_platform.audit import audit
from cues_platform.processing import BackingQueue, GraphRunner, Range, Snapshot
from cues_platform.processing.history import (
    HomeDigests,
    commit_records,
    log_records,
    processor_history,
)
from cues_platform.queues import maintenance
from tests.processing.graphs import PID, build_graph, check_exact, load_inputs

N, BATCH = 30, 5  # 6 one-commit steps; a digest after steps 2, 4 and 6


def graph_with_maintenance(every: int):
    graph = build_graph("map", "output", batch=BATCH)
    proc = graph.processors[PID]
    proc = replace(proc, options=replace(proc.options, backing_maintenance_every=every))
    return type(graph).build(name=graph.name, queues=list(graph.queues.values()), processors=[proc],
                             error_queue=graph.error_queue)


def assert_every_step_audited_and_recovered(spark, lake, graph) -> None:
    """Every step is in the merged history, the output is exact, the audit passes, and a new
    runner recovers to the end (recovery reads the home's app transactions, which checkpoints
    keep) without stepping again."""
    attempts = [r for r in processor_history(lake, PID) if r.is_attempt]
    assert [a.step for a in attempts] == list(range(N // BATCH))
    check_exact(lake, "map", "output", n=N, batch=BATCH)
    assert audit(lake, graph=graph).ok, audit(lake, graph=graph).to_text()
    again = GraphRunner(graph=graph, lake=lake, spark=spark)
    assert again.run_until_idle()[PID].steps == 0
    assert again.steppers[PID].positions == {"src": N}


def trim_log(lake, name: str) -> None:
    """What Delta does to an old log: a checkpoint, then every commit entry before it removed."""
    queue = lake.queue(name)
    queue.refresh().alter.set_table_properties({"delta.logRetentionDuration": "interval 0 hours"})
    maintenance.checkpoint(queue)
    DeltaTable(queue.uri).cleanup_metadata()


def test_digests_keep_the_step_records_when_the_log_is_trimmed(spark, lake):
    graph = graph_with_maintenance(every=2)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "map", n=N)
    runner.run_until_idle()
    raw = HomeDigests(lake, "b").queue.read_arrow(partition="0").to_pylist()
    assert [r["processor"] for r in raw] == [PID] * 3  # each holds the two steps since the last one
    assert BackingQueue(lake, PID).last_record() is None  # one-commit steps: nothing in the backing
    trim_log(lake, "b")
    assert log_records(lake.queue("b"), processor=PID)[0] == {}  # the log no longer has them
    assert [r.step for r in commit_records(lake.queue("b"), processor=PID)[0][PID]] == list(range(6))
    assert_every_step_audited_and_recovered(spark, lake, graph)


def test_without_digests_a_trimmed_log_is_an_audit_failure_not_a_silent_pass(spark, lake):
    """The limit the digests remove, shown: no maintenance, a trimmed log: the audit cannot see
    the steps and says so (it never reports a lake it cannot check as clean)."""
    graph = graph_with_maintenance(every=0)
    GraphRunner(graph=graph, lake=lake, spark=spark)
    load_inputs(lake, "map", n=N)
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    trim_log(lake, "b")
    report = audit(lake, graph=graph)
    assert not report.ok and "b" in report.queues_checked
    assert {v.kind for v in report.violations} >= {"unknown_hash", "app_transaction"}


def _log_entries(queue) -> list[str]:
    return sorted(p.name for p in (queue.lake.local_path(queue.uri) / "_delta_log").glob("*.json"))


def test_the_stepper_trims_the_digested_home_log_at_the_default_retention(spark, lake):
    """The log retention is Delta's default (30 days), yet the home's log stays short: entries
    below the second-newest checkpoint that the digests cover go (home.trim_home_log), so
    commits and recovery do not list an ever longer log; nothing the audit reads is lost."""
    graph = graph_with_maintenance(every=2)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    home = lake.queue("b")
    home.refresh().alter.set_table_properties({"delta.checkpointInterval": "2"})
    load_inputs(lake, "map", n=N)
    runner.run_until_idle()
    entries = _log_entries(home)
    assert "00000000000000000000.json" not in entries
    assert len(entries) < home.refresh().version() + 1
    assert_every_step_audited_and_recovered(spark, lake, graph)


def test_a_digest_holds_every_processors_steps_in_a_shared_home(lake):
    """Two processors may share an output queue (lanes of one processor always do): a digest
    holds the step commits of both, so the trim below it loses neither's records and, unlike a
    trim per processor that stopped below the other's oldest step, actually shortens the log."""
    from cues_platform.processing.home import STEP_RECORD_KEY, trim_home_log
    from tests.support import PAYLOAD, rows

    q = lake.create_queue("shared", schema=PAYLOAD)
    q.refresh().alter.set_table_properties({"delta.checkpointInterval": "2"})

    def step(i: int, who: str) -> None:
        snap = Snapshot(who, i, {"src": Range("in", "0", i, i + 1)})
        q.append(rows(i, 1), partition="0", commit_metadata={
            STEP_RECORD_KEY: "commit", "cues.processor": who, "cues.step": str(i), "cues.epoch": "0",
            "cues.outcome": "attempt_output", "cues.snapshot": snap.to_json(),
            "cues.rows": '{"shared": {"0": 1}}', "cues.hash": snap.delivery_hash})

    for i in range(12):
        step(i, "p" if i != 3 else "other")
    upto = HomeDigests(lake, "shared").digest(q)
    assert upto == q.version()
    assert trim_home_log(q, digested=upto) > 0
    assert "00000000000000000000.json" not in _log_entries(q)
    assert len(_log_entries(q)) < 6
    found = commit_records(q)[0]
    assert [r.step for r in found["other"]] == [3]
    assert [r.step for r in found["p"]] == [i for i in range(12) if i != 3]
    assert q.read_arrow(partition="0")["id"].to_pylist() == list(range(12))
    # a second digest with nothing new moves nothing; one with a new step holds only it
    assert HomeDigests(lake, "shared").digest(q) == upto
    step(12, "other")
    HomeDigests(lake, "shared").digest(q)
    assert [r.step for r in commit_records(q)[0]["other"]] == [3, 12]


def test_a_busy_lanes_digest_keeps_a_quiet_lanes_step_records_however_old(spark, lake):
    """The review's reproduction (issue 22, item 2): lanes p and p.x share the home ``b``; p.x
    takes one step; its log entry ages past the retention ("31 days": a retention of 0 hours);
    p reaches its digest. The digest cleaned expired entries of ``b`` by age and deleted p.x's
    step commit, which no digest held: the audit then failed for good on an exact delivery.
    Now the digest holds every processor's steps of the home before anything is trimmed, and no
    entry is dropped by age."""
    from cues_platform.processing import (
        ERROR_SCHEMA,
        Graph,
        In,
        Kind,
        Options,
        Out,
        Processor,
        QueueDef,
    )
    from tests.support import PAYLOAD, rows

    def copy(ctx, src):
        return src

    g = Graph.build(name="g", queues=[QueueDef("a", PAYLOAD, ("0", "x")), QueueDef("b", PAYLOAD),
                                      QueueDef("errors", ERROR_SCHEMA)],
                    processors=[Processor("p", Kind.MAP, copy, {"src": In("a")}, {"out": Out("b", "0")},
                                          options=Options(batch_size=2, backing_maintenance_every=2))],
                    error_queue="errors")
    GraphRunner(graph=g, lake=lake, spark=spark)
    lake.queue("a").append(rows(1_000, 1), partition="x")
    GraphRunner(graph=g, lake=lake, spark=spark, only=["p.x"]).run_until_idle()  # one quiet step
    home = lake.queue("b")
    home.refresh().alter.set_table_properties({"delta.logRetentionDuration": "interval 0 hours",
                                               "delta.checkpointInterval": "2"})
    lake.queue("a").append(rows(0, 8), partition="0")
    GraphRunner(graph=g, lake=lake, spark=spark, only=["p"]).run_until_idle()  # 4 steps, 2 digests
    assert "00000000000000000000.json" not in _log_entries(home)  # the shared log was trimmed
    assert [r.step for r in processor_history(lake, "p.x") if r.is_attempt] == [0]
    assert [r.step for r in processor_history(lake, "p") if r.is_attempt] == [0, 1, 2, 3]
    report = audit(lake, graph=g)
    assert report.ok, report.to_text()
