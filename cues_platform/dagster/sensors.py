"""Sensors of a graph: new input data, run failures (recovery), and sinks.

New-data sensor (one per processor with inputs; for a sink it is the *sink sensor*): the cursor
is the JSON of the input queues' Delta versions. When they differ from the cursor, the tick
requests one run of the processor's assets with ``run_key = <processor>@<queue>.v<version>+...``:
the same versions always give the same key and Dagster never launches two runs with one key for a
sensor, so a tick repeated after a crash (before its cursor was saved) launches nothing twice.
With no new commit, it still requests a run while the processor's latest materialization left
input behind (``cues/lag_total`` > 0: a ``@processor_asset`` takes one step per run, a bounded
run stops early), keyed ``...+catch_up.<that materialization's run id>``: one run per such
materialization, so a failed run (no materialization) never makes a storm of requests.

Recovery sensor (one per graph), for instances WITHOUT Dagster's run retries: after a run that
materialized (or planned to materialize) some of the graph's processor assets failed, it requests
a run of the assets that run did not materialize (the failed ones and those skipped after them),
which starts with recovery, with ``run_key = recovery:<failed run id>``. Its cursor is the
event-log storage id of the last RUN_FAILURE event it has handled, and a tick returns its run
requests and its new cursor together (``SensorResult``): if the tick fails, neither is kept and
the next tick sees the same failures again; the cursor never moves past a failure without a
request for it.

Why the event log and not run records: a run's storage id is assigned when the run is *created*,
so a cursor over run ids skips a run created before a failure already handled but failing after
it (a long run failing while another tick was being processed). RUN_FAILURE events get their
storage ids when the failure is *recorded*, in the order failures happen. And why not
``@run_failure_sensor``: it moves its cursor past an event even when its function raised.

One recovery mechanism per instance: where ``run_retries`` is enabled (the deployment's
``dagster.yaml``), Dagster re-executes a failed run from failure (only the failed steps and those
after them) and this sensor requests nothing: it moves its cursor and says why. Both would
otherwise re-run one failure.

Every sensor here is RUNNING by default (``default_status``): the daemon of ``dagster dev`` ticks
them as soon as the code location loads.
"""

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from dagster import (
    AssetKey,
    AssetSelection,
    DagsterEventType,
    DefaultSensorStatus,
    RunRequest,
    RunStatusChangeRecordsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from cues_platform.dagster.assets import LAKE_KEY, processor_keys
from cues_platform.processing.graph import Graph, Kind, Processor

RECOVERY_OF_TAG = "cues/recovery_of"
RECOVERY_ATTEMPT_TAG = "cues/recovery_attempt"
TRIGGER_TAG = "cues/trigger"
MAX_FAILURES_PER_TICK = 100


def input_queues(proc: Processor) -> list[str]:
    return sorted({i.queue for i in proc.inputs.values()})


def input_versions(lake: Any, proc: Processor) -> dict[str, int]:
    """Delta version of every input queue of ``proc`` (-1: the queue does not exist yet)."""
    return {q: (lake.queue(q).version() if lake.has_queue(q) else -1) for q in input_queues(proc)}


def new_data_run_key(processor_id: str, versions: dict[str, int]) -> str:
    body = "+".join(f"{q}.v{v}" for q, v in sorted(versions.items()))
    key = f"{processor_id}@{body}"
    if len(key) > 200:
        key = f"{processor_id}@{hashlib.blake2b(body.encode(), digest_size=16).hexdigest()}"
    return key


def sensor_name(graph: Graph, proc: Processor) -> str:
    suffix = "sink" if proc.kind is Kind.SINK else "new_data"
    return f"{graph.name}__{proc.id}__{suffix}"


def build_new_data_sensor(graph: Graph, proc: Processor, *, prefix: Sequence[str] = (),
                          minimum_interval_seconds: int = 30,
                          default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING) -> Any:
    keys = processor_keys(proc, prefix)
    pid = proc.id
    what = "sink" if proc.kind is Kind.SINK else "processor"

    @sensor(name=sensor_name(graph, proc), target=AssetSelection.assets(*keys),
            minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
            required_resource_keys={LAKE_KEY},
            description=f"Runs {what} {pid!r} when one of its input queues "
                        f"({', '.join(input_queues(proc))}) has a new Delta version.")
    def _new_data(context: SensorEvaluationContext):
        lake = getattr(context.resources, LAKE_KEY).lake()
        versions = input_versions(lake, proc)
        cursor = json.dumps(versions, sort_keys=True)
        previous = json.loads(context.cursor) if context.cursor else None
        if previous == versions:
            behind = lag_after_latest(context.instance, keys[0])
            if behind is None:
                return SkipReason(f"no new commits on {', '.join(versions)} since the last run request")
            # no new input, but the latest materialization stopped behind it (a function asset
            # takes one step per run; a runner-face run may have hit a bound): one run per such
            # materialization (its run id in the key) until the processor has caught up
            run_id, lag = behind
            request = RunRequest(run_key=f"{new_data_run_key(pid, versions)}+catch_up.{run_id}",
                                 asset_selection=keys,
                                 tags={TRIGGER_TAG: "catch_up", "cues/processor": pid,
                                       "cues/lag_total": str(lag)})
            return SensorResult(run_requests=[request], cursor=cursor)
        if not any(_has_rows(lake, q) for q in versions):
            return SensorResult(skip_reason=SkipReason("the input queues are empty"), cursor=cursor)
        request = RunRequest(run_key=new_data_run_key(pid, versions), asset_selection=keys,
                             tags={TRIGGER_TAG: "new_data", "cues/processor": pid})
        return SensorResult(run_requests=[request], cursor=cursor)

    return _new_data


def lag_after_latest(instance: Any, key: AssetKey) -> tuple[str, int] | None:
    """``(run id, lag)`` of the asset's latest materialization when it left input unprocessed
    (``cues/lag_total`` > 0), else None."""
    event = instance.get_latest_materialization_event(key)
    mat = event.asset_materialization if event is not None else None
    lag = mat.metadata.get("cues/lag_total") if mat is not None else None
    if lag is None or not int(lag.value):
        return None
    return event.run_id, int(lag.value)


def _has_rows(lake: Any, name: str) -> bool:
    return lake.has_queue(name) and any(lake.queue(name).end_offsets().values())


def _run_asset_keys(instance: Any, run_id: str, event_type: DagsterEventType) -> set[AssetKey]:
    records = instance.get_records_for_run(run_id, of_type=event_type).records
    keys = set()
    for rec in records:
        event = rec.event_log_entry.dagster_event
        key = getattr(event.event_specific_data, "asset_key", None) if event is not None else None
        if key is None and event is not None:
            key = getattr(getattr(event.event_specific_data, "materialization", None), "asset_key", None)
        if key is not None:
            keys.add(key)
    return keys


def failed_run_assets(instance: Any, run: Any, ours: set[AssetKey]) -> list[AssetKey]:
    """The graph's processor assets a failed run selected (or planned) and did not materialize:
    the failed ones and those skipped after them, in key order."""
    planned = set(run.asset_selection or ()) & ours
    if not planned:
        planned = _run_asset_keys(instance, run.run_id, DagsterEventType.ASSET_MATERIALIZATION_PLANNED) & ours
    done = _run_asset_keys(instance, run.run_id, DagsterEventType.ASSET_MATERIALIZATION)
    return sorted(planned - done, key=lambda k: k.to_user_string())


def build_recovery_sensor(graph: Graph, *, prefix: Sequence[str] = (), max_attempts: int = 3,
                          minimum_interval_seconds: int = 30,
                          default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING) -> Any:
    ours: set[AssetKey] = {k for p in graph.processors.values() for k in processor_keys(p, prefix)}

    @sensor(name=f"{graph.name}__recovery", target=AssetSelection.assets(*ours),
            minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
            description="On an instance without run retries: after a run of this graph's processor "
                        "assets fails, launches one recovery run of the assets it did not "
                        "materialize (recovery is idempotent; exactly-once holds).")
    def _recovery(context: SensorEvaluationContext):
        state = json.loads(context.cursor) if context.cursor else {}
        after = state.get("after_storage_id")
        records = context.instance.fetch_run_status_changes(
            RunStatusChangeRecordsFilter(DagsterEventType.RUN_FAILURE, after_storage_id=after),
            limit=MAX_FAILURES_PER_TICK, ascending=True).records
        if context.instance.run_retries_enabled:  # one mechanism: Dagster's, from failure
            if records:
                after = records[-1].storage_id
            cursor = json.dumps({"after_storage_id": after}) if after is not None else context.cursor
            return SensorResult(skip_reason=SkipReason(
                "run retries are on for this instance (dagster.yaml run_retries): Dagster re-executes "
                "failed runs from failure, so this sensor requests nothing"), cursor=cursor)
        requests: list[RunRequest] = []
        skipped: list[str] = []
        for record in records:
            run = context.instance.get_run_by_id(record.run_id)
            after = record.storage_id
            if run is None:
                continue
            keys = failed_run_assets(context.instance, run, ours)
            if not keys:
                continue
            attempt = int(run.tags.get(RECOVERY_ATTEMPT_TAG, "0")) + 1
            if attempt > max_attempts:
                skipped.append(run.run_id)
                context.log.warning(f"run {run.run_id} failed after {attempt - 1} recovery "
                                    f"attempt(s); not retrying (max {max_attempts})")
                continue
            root = run.tags.get(RECOVERY_OF_TAG, run.run_id)
            requests.append(RunRequest(
                run_key=f"recovery:{run.run_id}", asset_selection=keys,
                tags={TRIGGER_TAG: "recovery", RECOVERY_OF_TAG: root,
                      RECOVERY_ATTEMPT_TAG: str(attempt), "cues/failed_run": run.run_id}))
        cursor = json.dumps({"after_storage_id": after}) if after is not None else context.cursor
        if not requests:
            reason = "no new failed runs of this graph's assets"
            if skipped:
                reason = f"failed runs past the recovery limit: {', '.join(skipped)}"
            return SensorResult(skip_reason=SkipReason(reason), cursor=cursor)
        return SensorResult(run_requests=requests, cursor=cursor)

    return _recovery


def build_sensors(graph: Graph, *, prefix: Sequence[str] = (), minimum_interval_seconds: int = 30,
                  max_recovery_attempts: int = 3,
                  default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING) -> list[Any]:
    out = [build_new_data_sensor(graph, graph.as_declared(pid), prefix=prefix,
                                 minimum_interval_seconds=minimum_interval_seconds,
                                 default_status=default_status)
           for pid in graph.family_order() if graph.as_declared(pid).inputs]
    out.append(build_recovery_sensor(graph, prefix=prefix, max_attempts=max_recovery_attempts,
                                     minimum_interval_seconds=minimum_interval_seconds,
                                     default_status=default_status))
    return out
