"""Step digests: the one-commit steps' records survive the trimming of their home queue's Delta log
(the auditor reads them from the backing queue's digest records), and a digest changes nothing
that recovery reads."""

from __future__ import annotations

from dataclasses import replace

from deltalake import DeltaTable

from cues_platform.audit import audit
from cues_platform.processing import BackingQueue, GraphRunner, RecordType
from cues_platform.processing.history import commit_records, processor_history
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
    raw = [r["type"] for r in BackingQueue(lake, PID).queue.read_arrow(partition="0").to_pylist()]
    assert raw.count(RecordType.DIGEST.value) == 3  # each holds the two steps since the last one
    last = BackingQueue(lake, PID).last_record()  # recovery's read: type and step, steps undecoded
    assert (last.type, last.step, last.outputs) == (RecordType.DIGEST, N // BATCH - 1, {})
    trim_log(lake, "b")
    assert commit_records(lake.queue("b"), processor=PID)[0] == {}  # the log no longer has them
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


def test_the_stepper_drops_the_homes_expired_log_only_after_digesting_it(spark, lake):
    """No commit cleans the log by itself (queues/maintenance.py, COMMIT_HOOKS); the stepper does,
    right after each digest, so what it drops is already in the backing queue."""
    graph = graph_with_maintenance(every=2)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    home = lake.queue("b")
    home.refresh().alter.set_table_properties({"delta.logRetentionDuration": "interval 0 hours",
                                               "delta.checkpointInterval": "2"})
    load_inputs(lake, "map", n=N)
    runner.run_until_idle()
    entries = _log_entries(home)
    assert "00000000000000000000.json" not in entries  # expired entries before a checkpoint: gone
    assert len(entries) < home.refresh().version() + 1
    attempts = [r for r in processor_history(lake, PID) if r.is_attempt]
    assert [a.step for a in attempts] == list(range(N // BATCH))  # every step: digested first
    check_exact(lake, "map", "output", n=N, batch=BATCH)
    assert audit(lake, graph=graph).ok, audit(lake, graph=graph).to_text()


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


def test_another_processors_step_records_in_the_same_home_are_not_trimmed(lake):
    """Two processors may share an output queue; one's digests say nothing of the other's step
    records, so trimming stops below the other's oldest step commit."""
    from cues_platform.processing.home import STEP_RECORD_KEY, trim_home_log
    from tests.support import PAYLOAD, rows

    q = lake.create_queue("shared", schema=PAYLOAD)
    q.refresh().alter.set_table_properties({"delta.checkpointInterval": "2"})
    for i in range(12):
        who = "other" if i == 3 else "p"
        q.append(rows(i, 1), partition="0",
                 commit_metadata={STEP_RECORD_KEY: "commit", "cues.processor": who})
    other_version = next(int(e["version"]) for e in q.refresh().history() if e.get("cues.processor") == "other")
    assert trim_home_log(q, "p", digested=q.version()) > 0
    left = _log_entries(q)
    assert "00000000000000000000.json" not in left  # below the cut: trimmed
    assert all(f"{v:020d}.json" in left for v in range(other_version, q.version() + 1))
    assert q.read_arrow(partition="0")["id"].to_pylist() == list(range(12))
    # for a third processor every step record here is foreign: nothing more goes
    assert trim_home_log(q, "nobody-else", digested=q.version()) == 0  # "p" is foreign now
