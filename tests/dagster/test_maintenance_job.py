"""The Dagster maintenance job (cues_platform/dagster/maintenance.py): every queue of the lake gets
`cues queue maintain` (retention, then compaction, checkpoint and vacuum); a queue that fails does
not stop the others and the run fails naming it; the daily schedule vacuums with the CLI's
retention. And the asset checks after retention removed the rows they judge (checks.py)."""

from __future__ import annotations

from typing import Any

import pytest
from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetSelection,
    DefaultScheduleStatus,
    build_schedule_context,
    materialize,
)

from cues_platform.dagster import LakeResource
from cues_platform.dagster.maintenance import (
    MAINTENANCE_CRON,
    MAINTENANCE_JOB,
    MAINTENANCE_OP,
    build_maintenance_definitions,
    describe_maintenance,
    maintenance_schedule_name,
)
from cues_platform.errors import ConfigurationError
from cues_platform.queues import Lake, OffsetOutOfRangeError
from cues_platform.queues.errors import ConcurrentAppendError, UnsafeRetentionError
from cues_platform.queues.retention import RETENTION_MS_KEY, set_policy
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.graphs import load_orders
from tests.support import rows


def _run(lake: Lake, instance, **config: Any):
    defs = build_maintenance_definitions(lake=LakeResource(root=lake.root))
    job = defs.resolve_job_def(MAINTENANCE_JOB)
    return job.execute_in_process(
        instance=instance, raise_on_error=False,
        run_config={"ops": {MAINTENANCE_OP: {"config": config}}} if config else None)


def _messages(instance, result) -> list[str]:
    return [e.user_message for e in instance.all_logs(result.run_id) if e.user_message]


def _output_metadata(result) -> dict[str, Any]:
    (event,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    return {k: v.value for k, v in event.event_specific_data.metadata.items()}


def _three_files(lake: Lake, name: str):
    q = lake.create_queue(name, schema=rows(0, 1).schema, partitions=("0",))
    for start, count in ((0, 4), (4, 3), (7, 3)):  # ids = offsets 0..9 in three files
        q.append(rows(start, count), partition="0")
    return q


def test_the_job_applies_each_queues_retention_and_maintains_every_queue(lake, instance) -> None:
    """``kept`` has retention 0 ms and a tailer committed at 4: its start moves to 4, not past,
    and reads below it are refused; ``plain`` has no policy: nothing removed, its three files
    compacted. Both are vacuumed (a 0 h retention, allowed as unsafe: no one else uses this lake)
    and the log and the op's metadata say so per queue."""
    kept = _three_files(lake, "kept")
    kept.tailer("keeper", partition="0").commit(4)
    set_policy(kept, ms=0, bytes=None)
    _three_files(lake, "plain")

    result = _run(lake, instance, retention_hours=0.0, unsafe_allow_short_retention=True)

    assert result.success
    kept = lake.queue("kept")
    assert kept.start_offset("0") == 4
    assert kept.read_arrow(partition="0")["id"].to_pylist() == [4, 5, 6, 7, 8, 9]
    with pytest.raises(OffsetOutOfRangeError):
        kept.read_arrow(partition="0", start=3)
    plain = lake.queue("plain")
    assert plain.start_offset("0") == 0 and len(plain.files(partition="0")) == 1
    meta = _output_metadata(result)
    assert (meta["queues_maintained"], meta["queues_failed"], meta["offsets_removed"]) == (2, 0, 4)
    by_queue = meta["by_queue"]
    assert by_queue["kept"]["offsets_removed"] == 4 and by_queue["kept"]["start_offsets"] == {"0": 4}
    assert by_queue["plain"]["offsets_removed"] == 0 and by_queue["plain"]["files_compacted"] == 3
    # compaction's three inputs of `plain` and the retention's rewritten/removed files of `kept`
    assert by_queue["plain"]["files_vacuumed"] == 3 and by_queue["kept"]["files_vacuumed"] >= 2
    assert meta["files_vacuumed"] == sum(q["files_vacuumed"] for q in by_queue.values())
    logged = _messages(instance, result)
    assert "  partition 0: start 0 -> 4 (next offset 10; readers need from 4: tailer 'keeper')" in logged
    assert "plain: retention keep every message (no retention)" in logged
    assert "plain: compacted 3 file(s) into 1" in logged
    assert any(m.startswith("plain: vacuumed 3 file(s)") for m in logged)


def test_a_failing_queue_does_not_stop_the_others_and_fails_the_run_naming_it(lake, instance) -> None:
    """``bad``'s retention property was written by another tool ('soon'): its maintenance fails
    with a ConfigurationError. ``a`` before it and ``c`` after it are maintained all the same;
    the run is red, naming ``bad`` and what to do; run again for ``bad`` alone once fixed."""
    for name in ("a", "bad", "c"):
        q = _three_files(lake, name)
        q.tailer("keeper", partition="0").commit(6)
        set_policy(q, ms=0, bytes=None)
    lake.queue("bad").refresh().alter.set_table_properties({RETENTION_MS_KEY: "soon"},
                                                          raise_if_not_exists=False)

    result = _run(lake, instance)

    assert not result.success
    assert [lake.queue(n).start_offset("0") for n in ("a", "bad", "c")] == [6, 0, 6]
    assert len(lake.queue("c").files(partition="0")) == 1  # compacted after bad failed
    (failure,) = result.get_step_failure_events()
    text = failure.step_failure_data.user_failure_data.description
    assert "maintenance failed for 1 of 3 queue(s)" in text
    assert "'bad': ConfigurationError: queue 'bad': cues.retention.ms must be a whole number" in text
    assert "not retryable as is" in text and "queues: ['bad']" in text
    meta = {k: v.value for k, v in failure.step_failure_data.user_failure_data.metadata.items()}
    assert (meta["queues_maintained"], meta["queues_failed"]) == (2, 1)
    assert set(meta["by_queue"]) == {"a", "c"} and set(meta["failed"]) == {"bad"}
    assert any(m.startswith("bad: maintenance failed: ConfigurationError")
               for m in _messages(instance, result))

    set_policy(lake.queue("bad"), ms=0, bytes=None)  # the operator fixes it ...
    again = _run(lake, instance, queues=["bad"])  # ... and runs the failed queue alone
    assert again.success and _output_metadata(again)["queues_maintained"] == 1
    assert lake.queue("bad").start_offset("0") == 6


def test_a_retryable_failure_says_run_again() -> None:
    """A lost commit race (retryable) is told apart from a failure that needs a fix."""
    from cues_platform.dagster.maintenance import _failure_text

    race = ConcurrentAppendError("queue 'q': retention lost its commit race", queue="q",
                                 retryable=True)
    assert _failure_text(race) == ("ConcurrentAppendError: queue 'q': retention lost its commit "
                                   "race (retryable: run again)")
    assert _failure_text(ConfigurationError("bad")).endswith("(not retryable as is: fix it first)")
    assert "unexpected" in _failure_text(KeyError("x"))


def test_a_short_vacuum_retention_is_refused_before_any_queue_changes(lake, instance) -> None:
    q = _three_files(lake, "q")
    set_policy(q, ms=0, bytes=None)
    result = _run(lake, instance, retention_hours=0.5)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    cause = failure.step_failure_data.error.cause
    assert cause.cls_name == UnsafeRetentionError.__name__
    assert "shorter than the safe minimum of 1 h" in cause.message
    q = lake.queue("q")
    assert q.start_offset("0") == 0 and len(q.files(partition="0")) == 3


def test_the_daily_schedule_runs_the_job_with_the_clis_vacuum_retention(lake, instance) -> None:
    """On by default (as every schedule of build_definitions), daily, with the vacuum retention
    of `cues queue maintain` (24 h), which is also the job's default without run config."""
    from cues_platform.cli import queue_maintain

    (cli_default,) = [p.default for p in queue_maintain.params if p.name == "retention_hours"]
    defs = build_maintenance_definitions(lake=LakeResource(root=lake.root))
    schedule = defs.resolve_schedule_def(maintenance_schedule_name())
    assert schedule.cron_schedule == MAINTENANCE_CRON == "0 3 * * *"
    assert schedule.default_status is DefaultScheduleStatus.RUNNING
    assert schedule.job_name == MAINTENANCE_JOB
    (request,) = schedule.evaluate_tick(build_schedule_context(instance=instance)).run_requests
    config = request.run_config["ops"][MAINTENANCE_OP]["config"]
    assert config["retention_hours"] == cli_default == 24.0
    assert not config.get("unsafe_allow_short_retention") and config.get("queues") is None

    q = _three_files(lake, "q")
    result = _run(lake, instance)  # no run config: the same 24 h
    assert result.success
    maintained = [m for m in _messages(instance, result) if m.startswith("q: vacuumed")]
    assert maintained == ["q: vacuumed 0 file(s) (files older than 24 h by the real clock)"]
    assert len(q.files(partition="0")) == 1

    stopped = build_maintenance_definitions(default_status=DefaultScheduleStatus.STOPPED,
                                            cron=None, job_name="other")
    assert not list(stopped.schedules or [])


def test_describe_maintenance_says_what_each_step_did() -> None:
    from cues_platform.queues.maintenance import MaintenanceReport

    assert describe_maintenance(MaintenanceReport("q")) == "q: nothing to compact"
    assert describe_maintenance(MaintenanceReport("q", checkpoint_version=7, log_entries_removed=2)) == (
        "q: checkpoint at version 7, 2 expired log entr(ies) removed")


# -- the asset checks after retention ------------------------------------------------------------
def _check_results(defs, instance) -> dict[str, tuple[bool, Any, dict]]:
    """Runs the contract and outside_protocol checks of ``enriched`` alone (exactly_once is the
    auditor's: not judged here)."""
    keys = [AssetCheckKey(AssetKey("enriched"), n) for n in ("contract", "outside_protocol")]
    result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                         selection=AssetSelection.checks(*keys), raise_on_error=False)
    assert result.success  # no framework stack: the checks ran and said something
    return {e.check_name: (e.passed, e.severity, {k: v.value for k, v in e.metadata.items()})
            for e in result.get_asset_check_evaluations()}


def test_checks_rerun_after_retention_reopen_no_judged_row_and_claim_no_removed_one(
        defs, lake, instance) -> None:
    """Every processor read ``enriched`` to 30; a tailer holds it at 20. With retention 0 ms the
    maintenance job moves its start to 20. ``contract`` judged every row when it arrived (its
    memory: ``cues/judged_to``), so retention re-opens nothing: it passes, judging nothing new,
    and never claims the removed rows. ``outside_protocol`` remembers too: it passes. The tailer
    reads on; the next
    maintenance removes everything: ``contract`` still passes on nothing new. (Rows retention
    removes *before* any evaluation judged them: tests/dagster/test_check_memory.py.)"""
    load_orders(lake)
    assert materialize(assets_of(defs), resources=resources_of(defs), instance=instance).success
    enriched = lake.queue("enriched")
    tailer = enriched.tailer("audit-export", partition="0")
    tailer.read_arrow(20)
    tailer.commit()
    set_policy(enriched, ms=0, bytes=None)
    assert _run(lake, instance).success
    assert lake.queue("enriched").start_offset("0") == 20

    checks = _check_results(defs, instance)
    passed, severity, meta = checks["contract"]
    assert (passed, severity) == (True, AssetCheckSeverity.ERROR)
    assert meta["judged_ranges"] == {} and meta["rows_checked"] == 0 and "retained_away" not in meta
    assert meta["cues/judged_to"] == {"0": 30}
    passed, severity, meta = checks["outside_protocol"]
    assert (passed, severity, meta["rows"]) == (True, AssetCheckSeverity.WARN, 0)
    assert "retained_away" not in meta and meta["cues/judged_to"] == {"0": 30}

    tailer.read_arrow(10)
    tailer.commit()
    assert _run(lake, instance).success
    assert lake.queue("enriched").start_offset("0") == 30
    passed, severity, meta = _check_results(defs, instance)["contract"]
    assert (passed, meta["rows_checked"]) == (True, 0) and "retained_away" not in meta


def test_each_lake_resource_gets_its_own_job_in_one_code_location(tmp_path, instance) -> None:
    """The reference deployment has two lakes (``lake`` and ``participants_lake``): two jobs, two
    ops of distinct names, merged into one loadable code location; each maintains its own lake."""
    from dagster import Definitions

    from cues_platform.dagster.maintenance import maintenance_op_name

    main, other = Lake(root=str(tmp_path / "main")), Lake(root=str(tmp_path / "other"))
    for lake in (main, other):
        set_policy(_three_files(lake, "q"), ms=0, bytes=None)  # no reader: everything may go
    merged = Definitions.merge(
        build_maintenance_definitions(lake=LakeResource(root=main.root)),
        build_maintenance_definitions(lake_key="participants_lake", job_name="other_maintenance",
                                      lake=LakeResource(root=other.root)))
    Definitions.validate_loadable(merged)
    assert {s.name for s in merged.schedules} == {"cues_maintenance__schedule",
                                                  "other_maintenance__schedule"}
    op_name = maintenance_op_name("participants_lake")
    assert op_name == "maintain_queues__participants_lake"
    result = merged.resolve_job_def("other_maintenance").execute_in_process(
        instance=instance, run_config={"ops": {op_name: {"config": {"retention_hours": 1.0}}}})
    assert result.success
    assert (main.queue("q").start_offset("0"), other.queue("q").start_offset("0")) == (0, 10)


def test_the_reference_deployment_maintains_both_lakes_nightly() -> None:
    """``definitions.py`` (what `dagster dev` loads) has a maintenance job and a running daily
    schedule for each lake resource."""
    from dagster import DefaultScheduleStatus

    import definitions

    defs = definitions.defs
    jobs = {j.name for j in defs.jobs}
    schedules = {s.name: s for s in defs.schedules}
    assert {"cues_maintenance", "cues_maintenance_participants"} <= jobs
    for name in ("cues_maintenance__schedule", "cues_maintenance_participants__schedule"):
        assert schedules[name].default_status is DefaultScheduleStatus.RUNNING
    assert schedules["cues_maintenance__schedule"].cron_schedule == "0 3 * * *"
