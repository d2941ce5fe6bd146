"""Exactly-once under every way Dagster re-executes a processor: an op retry policy, re-execution
from failure, and run retries (the daemon's own function creates the retried run).

Each test fails a run at a chosen point of the step protocol (``ProcessorRunConfig``'s fault
injection), lets Dagster re-execute, then checks the outputs hold every expected row exactly once
and that ``cues audit`` (``cues_platform.audit.audit``) is clean (``check_exact``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from dagster import (
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    ReexecutionOptions,
    RetryPolicy,
    RunsFilter,
    execute_job,
    instance_for_test,
    materialize,
    reconstructable,
)
from dagster._core.execution.api import execute_run
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.storage.tags import PARENT_RUN_ID_TAG, RETRY_NUMBER_TAG, ROOT_RUN_ID_TAG
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.auto_run_reexecution.auto_run_reexecution import (
    consume_new_runs_for_automatic_reexecution,
)
from dagster._utils.hosted_user_process import recon_job_from_origin

from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.graphs import check_exact, ids, load_orders
from tests.dagster.jobs import GRAPH, all_job
from tests.support import ROOT


def _failure(op: str, point: str, *, step: int | None = None, once: Path | None = None) -> dict:
    config: dict = {"inject_failure_at": point}
    if step is not None:
        config["inject_failure_step"] = step
    if once is not None:
        config["inject_failure_once_file"] = str(once)
    return {"ops": {op: {"config": config}}}


def _failed_steps(result) -> list[str]:
    return [e.step_key for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]


# -- op retry policy ------------------------------------------------------------------------------
@pytest.mark.parametrize(("op", "point", "step"), [
    ("split", "between_commits", 1),  # fork: 'small' committed, home 'big' not: the retry rolls forward
    ("enrich", "after_prepare", 1),  # one-commit step, nothing recorded yet: the retry plans it again
    ("archive", "after_commit", None),  # sink effect and commit done, the op fails after them
])
def test_op_retry_policy_keeps_exactly_once(graph, lake, instance, tmp_path, op, point, step) -> None:
    load_orders(lake)
    defs = build_definitions(graph, lake=LakeResource(root=lake.root), spark=CuesSparkResource(),
                             retry_policy=RetryPolicy(max_retries=1))
    once = tmp_path / "fired"
    result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                         run_config=_failure(op, point, step=step, once=once))
    assert result.success
    assert once.exists(), "the injected failure never fired"
    retried = [e.step_key for e in result.all_events
               if e.event_type == DagsterEventType.STEP_UP_FOR_RETRY]
    assert retried == [op]
    check_exact(lake)


# -- re-execute from failure ----------------------------------------------------------------------
def test_reexecute_from_failure_keeps_exactly_once(lake, spark, monkeypatch) -> None:
    monkeypatch.setenv("CUES_LAKE", lake.root)
    load_orders(lake)
    job = reconstructable(all_job)
    with instance_for_test() as instance:
        failed = execute_job(job, instance=instance, raise_on_error=False,
                             run_config=_failure("split", "between_commits", step=1))
        assert not failed.success
        assert _failed_steps(failed) == ["split"]
        assert ids(lake, "enriched") == [i * 2 for i in range(30)]  # enrich finished
        # split's step 1 is half delivered: 'small' has it, its home queue 'big' (committed
        # last, closing the step) does not
        assert 28 in ids(lake, "small") and 30 not in ids(lake, "big")
        options = ReexecutionOptions.from_failure(failed.run_id, instance)
        with execute_job(job, instance=instance, reexecution_options=options, run_config={}) as again:
            assert again.success
            ran = {e.step_key for e in again.all_events
                   if e.event_type == DagsterEventType.STEP_SUCCESS}
            assert ran == {"split", "split_checks", "archive", "archive_checks"}
            assert again.dagster_run.parent_run_id == failed.run_id
    check_exact(lake)


# -- run retries (dagster.yaml run_retries) --------------------------------------------------------
@pytest.fixture
def retrying_instance() -> DagsterInstance:
    overrides = {
        "run_retries": {"enabled": True, "max_retries": 1},
        # keeps the submitted retry run instead of launching a process: the test runs it
        "run_coordinator": {"module": "dagster._core.test_utils", "class": "MockedRunCoordinator"},
    }
    with instance_for_test(overrides=overrides) as instance:
        yield instance


def _workspace(instance: DagsterInstance) -> WorkspaceProcessContext:
    origin = LoadableTargetOrigin(executable_path=sys.executable, module_name="tests.dagster.jobs",
                                  working_directory=str(ROOT), attribute="defs")
    target = InProcessWorkspaceLoadTarget(InProcessCodeLocationOrigin(origin, location_name="shop"))
    return WorkspaceProcessContext(instance, target)


def test_run_retry_by_the_daemon_keeps_exactly_once(lake, spark, monkeypatch, tmp_path,
                                                     retrying_instance) -> None:
    """The failed run is created from the workspace (as the webserver does) and run in-process (as
    a run worker does); the daemon's ``consume_new_runs_for_automatic_reexecution`` creates and
    submits the retry (strategy FROM_FAILURE, parent run config and tags)."""
    monkeypatch.setenv("CUES_LAKE", lake.root)
    load_orders(lake)
    instance = retrying_instance
    once = tmp_path / "fired"
    with _workspace(instance) as workspace:
        location = workspace.create_request_context().get_code_location("shop")
        remote_job = location.get_repository("__repository__").get_full_job(f"{GRAPH.name}__all")
        run = instance.create_run_for_job(
            all_job(), run_config=_failure("split", "between_commits", step=1, once=once),
            remote_job_origin=remote_job.get_remote_origin(),
            job_code_origin=remote_job.get_python_origin())
        first = execute_run(recon_job_from_origin(run.job_code_origin), run, instance)
        assert not first.success and once.exists()
        failed = instance.get_run_by_id(run.run_id)
        assert failed.status == DagsterRunStatus.FAILURE
        assert failed.tags.get("dagster/will_retry") == "true"

        records = instance.get_run_records(filters=RunsFilter(statuses=[DagsterRunStatus.FAILURE]))
        list(consume_new_runs_for_automatic_reexecution(workspace, records, logging.getLogger()))
        (retry,) = instance.run_coordinator.queue()
        assert retry.parent_run_id == run.run_id and retry.tags[RETRY_NUMBER_TAG] == "1"
        assert retry.tags[PARENT_RUN_ID_TAG] == run.run_id and retry.tags[ROOT_RUN_ID_TAG] == run.run_id
        assert retry.run_config == run.run_config  # the same fault config: the once-file stops it
        plan = instance.get_execution_plan_snapshot(retry.execution_plan_snapshot_id)
        assert set(plan.step_keys_to_execute) == {"split", "split_checks", "archive", "archive_checks"}
        second = execute_run(recon_job_from_origin(retry.job_code_origin), retry, instance)
        assert second.success
        # a later daemon tick over the same failure launches nothing more
        records = instance.get_run_records(filters=RunsFilter(statuses=[DagsterRunStatus.FAILURE]))
        list(consume_new_runs_for_automatic_reexecution(workspace, records, logging.getLogger()))
        assert len(instance.run_coordinator.queue()) == 1 and len(instance.get_runs()) == 2
    check_exact(lake)

