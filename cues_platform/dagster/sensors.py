"""Sensors of a graph: unread input (the lag), a join waiting for its source, run failures.

New-data sensor (one per processor with inputs; for a sink it is the *sink sensor*): it reads,
from the Delta logs only (no Spark, nothing written: ``processing/idle.py``), each lane's input
next offsets and its positions there, and requests one run of the processor's assets when some
lane has *work*: unread rows a step would take (a map, join, fork or sink needs unread rows on
every input, an alts on any), or an attempt or snapshot that recovery must finish. The run key is
``<processor>@<queue>/<partition>.o<next offset>+...+read.<sum of positions>``: the same input
and progress always give the same key, and Dagster never launches two runs with one key for a
sensor, so a tick repeated after a crash (before its cursor was saved) launches nothing twice, and
a run that failed without progress is not launched again (the recovery sensor or Dagster's run
retries handle it). A run that stopped behind its input (a ``@processor_asset`` takes one step
per run, a bounded run stops early) moved the positions: the next tick asks again (``catch_up``).

Why the lag and not Delta versions: every start of an exactly_once processor fences (an empty
commit in its home queue, an output queue of the graph), so a version-keyed sensor saw each no-op
run of an upstream processor as new data downstream and launched the next no-op run, without end.
An empty commit moves no next offset and no position; and a processor with nothing to do is not
started at all (``assets.idle_lane``). A drained lake launches no run.

On-demand sensor (one per source processor read by a join): the join steps only when every input
has unread rows, so when it waits with unread rows on its other inputs and none on the source's
queue, the sensor requests a run of the source (the reference ``fx`` publishes a fixing exactly
then), keyed by the join's input state: the join never waits for the graph's schedule.

Why sensors and not ``AutomationCondition``: a condition that reads the lag must be a custom
Python condition, evaluated in the code server (``AutomationConditionSensorDefinition(...,
use_user_code_server=True)``, beta in dagster 1.13); its run requests carry no run key, so a tick
evaluated again after a daemon crash can launch a second run of the same input, where the keyed
sensor cannot. The built-in conditions key on materializations and data versions, which is what
made fences look like new data.

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

Freshness: with ``freshness`` (``build_definitions``' default), the new-data, sink and on-demand
sensors also report the ``freshness`` check of their processor's assets as runless
``AssetCheckEvaluation``s (``SensorResult(asset_events=...)``, also on a skipped tick): the age of
the oldest unread row (``freshness.py``), when its level differs from the newest stored
evaluation of the check or that one is ``report_every`` old (the cursors stay as described above). The
check shows on an idle lake, where no run is launched to evaluate it.

Every sensor here is RUNNING by default (``default_status``): the daemon of ``dagster dev`` ticks
them as soon as the code location loads, every ``CUES_SENSOR_INTERVAL`` seconds in the deployment.
"""

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetKey,
    AssetSelection,
    DagsterEventType,
    DefaultSensorStatus,
    RunRequest,
    RunStatusChangeRecordsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    sensor,
)

from cues_platform.dagster.assets import LAKE_KEY, processor_keys
from cues_platform.dagster.checks import check_specs
from cues_platform.dagster.freshness import (
    Freshness,
    evaluate,
    freshness_check_keys,
    freshness_processors,
    last_reported,
    sensor_report,
    without_freshness,
)
from cues_platform.dagster.keys import queue_key
from cues_platform.processing.graph import Graph, Kind, Processor
from cues_platform.processing.idle import LaneWork, family_work, source_wanted

RECOVERY_OF_TAG = "cues/recovery_of"
RECOVERY_ATTEMPT_TAG = "cues/recovery_attempt"
TRIGGER_TAG = "cues/trigger"
MAX_FAILURES_PER_TICK = 100


def input_queues(proc: Processor) -> list[str]:
    return sorted({i.queue for i in proc.inputs.values()})


def upstream_gates(graph: Graph, proc: Processor, *, prefix: Sequence[str] = ()) -> list[AssetCheckKey]:
    """The blocking checks (``contract``, ``exactly_once``) on the assets of ``proc``'s input
    queues: while one of them is failing, the new-data sensor does not start ``proc`` (Dagster's
    blocking stops downstream steps only inside the run that evaluated the check; the sensors
    launch each processor in a run of its own)."""
    mine = {queue_key(q, prefix) for q in input_queues(proc)}
    families = sorted({graph.processors[p].family or p for q in input_queues(proc) for p in graph.producers_of(q)})
    return [spec.key for fam in families for spec in check_specs(graph, graph.as_declared(fam), prefix=prefix)
            if spec.blocking and spec.asset_key in mine]


def failing_gates(instance: Any, gates: Sequence[AssetCheckKey]) -> list[str]:
    """The gates whose newest completed evaluation failed with severity ERROR (a check never
    evaluated, or in flight, does not hold anything back)."""
    if not gates:
        return []
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(list(gates))
    failing = []
    for key, record in latest.items():
        event = record.event.dagster_event if record.event is not None else None
        evaluation = event.event_specific_data if event is not None else None
        if getattr(evaluation, "passed", True) is False and evaluation.severity is AssetCheckSeverity.ERROR:
            failing.append(key.to_user_string())
    return sorted(failing)


def input_versions(lake: Any, proc: Processor) -> dict[str, int]:
    """Delta version of every input queue of ``proc`` (-1: the queue does not exist yet)."""
    return {q: (lake.queue(q).version() if lake.has_queue(q) else -1) for q in input_queues(proc)}


def new_data_run_key(processor_id: str, versions: dict[str, int]) -> str:
    body = "+".join(f"{q}.v{v}" for q, v in sorted(versions.items()))
    return _short(processor_id, body)


def _short(processor_id: str, body: str) -> str:
    key = f"{processor_id}@{body}"
    if len(key) > 200:
        key = f"{processor_id}@{hashlib.blake2b(body.encode(), digest_size=16).hexdigest()}"
    return key


def input_state(works: Sequence[LaneWork], graph: Graph) -> tuple[dict[str, int], int]:
    """``({queue/partition: next offset}, sum of the lanes' positions)`` of a processor's lanes."""
    ends: dict[str, int] = {}
    read = 0
    for work in works:
        lane = graph.processors.get(work.processor)
        for binding, end in work.ends.items():
            src = lane.inputs[binding] if lane is not None else None
            name = f"{src.queue}/{src.partition}" if src is not None else binding
            ends[name] = end
            read += work.positions.get(binding, 0)
    return ends, read


def lag_run_key(processor_id: str, ends: dict[str, int], read: int) -> str:
    body = "+".join(f"{q}.o{e}" for q, e in sorted(ends.items()))
    return _short(processor_id, f"{body}+read.{read}")


def processor_job_name(graph: Graph, proc: Processor) -> str:
    """``{graph}__{processor}``: the job of one processor's assets, the name its runs carry
    (a run of an asset selection alone is named ``__anonymous_asset_job_...`` by Dagster)."""
    return f"{graph.name}__{proc.id}"


def processor_job(graph: Graph, proc: Processor, prefix: Sequence[str] = (), *, freshness: bool = False) -> Any:
    """The processor's job (with ``freshness``: without its ``freshness`` checks, which its sensor reports)."""
    keys = processor_keys(proc, prefix)
    fresh = freshness_check_keys(graph, prefix=prefix, processors=[proc.id]) if freshness else []
    return define_asset_job(processor_job_name(graph, proc),
                            selection=without_freshness(AssetSelection.assets(*keys), fresh),
                            description=f"{proc.kind.value} processor {proc.id!r} of graph {graph.name!r}",
                            tags={"cues/graph": graph.name, "cues/processor": proc.id})


def sensor_name(graph: Graph, proc: Processor) -> str:
    suffix = "sink" if proc.kind is Kind.SINK else "on_demand" if proc.kind is Kind.SOURCE else "new_data"
    return f"{graph.name}__{proc.id}__{suffix}"


def build_new_data_sensor(graph: Graph, proc: Processor, *, prefix: Sequence[str] = (),
                          minimum_interval_seconds: int = 30,
                          default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
                          freshness: Freshness | None = None) -> Any:
    keys = processor_keys(proc, prefix)
    pid = proc.id
    what = "sink" if proc.kind is Kind.SINK else "processor"
    queues = ", ".join(input_queues(proc))
    name = sensor_name(graph, proc)
    checked = freshness is not None  # its checks exist: its job leaves them to this sensor
    gates = upstream_gates(graph, proc, prefix=prefix)
    fresh = ("; reports its freshness check (the age of its oldest unread row)"
             if freshness is not None else "")

    @sensor(name=name, target=processor_job(graph, proc, prefix, freshness=checked),
            minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
            required_resource_keys={LAKE_KEY},
            description=f"Runs {what} {pid!r} when it has rows of {queues} it has not read (its "
                        f"lag, from the queues' offsets and its positions), or a step to recover{fresh}.")
    def _new_data(context: SensorEvaluationContext):
        lake = getattr(context.resources, LAKE_KEY).lake()
        works = family_work(lake, graph, pid)
        ends, read = input_state(works, graph)
        cursor = json.dumps({"ends": ends, "read": read}, sort_keys=True)
        previous = json.loads(context.cursor) if context.cursor else {}
        events: list[Any] = []
        if freshness is not None:
            verdict = evaluate(lake, graph, pid, freshness, works=works)
            events, _ = sensor_report(verdict, keys, last_reported(context, keys[0]), sensor=name)
        busy = [w for w in works if w.has_work]
        if not busy:
            if not any(ends.values()):
                return SensorResult(skip_reason=SkipReason(f"the input queues are empty ({queues})"),
                                    cursor=cursor, asset_events=events)
            lag = sum(w.lag for w in works)
            why = (f"no new commits with rows {pid!r} has not read on {queues}" if not lag else
                   f"{pid!r} waits for every input to have unread rows (lag {lag}: "
                   f"{ {w.processor: w.unread for w in works} })")
            return SensorResult(skip_reason=SkipReason(why), cursor=cursor, asset_events=events)
        trigger = "new_data" if previous.get("ends") != ends else "catch_up"
        pending = [w.pending for w in busy if w.pending]
        blocked = [] if pending else failing_gates(context.instance, gates)  # a decided step is finished
        if blocked:
            return SensorResult(skip_reason=SkipReason(
                f"{pid!r} has unread rows but waits: the blocking check(s) {', '.join(blocked)} of its "
                "input failed; fix the rows or the contract, or quarantine them (cues quarantine list "
                "QUEUE), and it runs after the check's next evaluation passes"),
                cursor=context.cursor, asset_events=events)
        tags = {TRIGGER_TAG: trigger, "cues/processor": pid,
                "cues/lag_total": str(sum(w.lag for w in works))}
        if pending:
            tags["cues/pending"] = pending[0][:200]
        request = RunRequest(run_key=lag_run_key(pid, ends, read), asset_selection=keys, tags=tags)
        return SensorResult(run_requests=[request], cursor=cursor, asset_events=events)

    return _new_data


def build_on_demand_sensor(graph: Graph, proc: Processor, *, prefix: Sequence[str] = (),
                           minimum_interval_seconds: int = 30,
                           default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
                           freshness: Freshness | None = None) -> Any:
    """The sensor of a source read by a join (see the module docstring)."""
    keys = processor_keys(proc, prefix)
    pid = proc.id
    name = sensor_name(graph, proc)
    checked = freshness is not None  # its checks exist: its job leaves them to this sensor
    outs = {o.queue for o in proc.outputs.values()}
    joins = sorted({p.family or p.id for p in graph.processors.values()
                    if p.kind is Kind.JOIN and any(i.queue in outs for i in p.inputs.values())})

    @sensor(name=name, target=processor_job(graph, proc, prefix, freshness=checked),
            minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
            required_resource_keys={LAKE_KEY},
            description=f"Runs source {pid!r} when join {', '.join(joins)} waits for it: unread rows "
                        f"on its other inputs, none on {', '.join(sorted(outs))}"
                        + ("; reports its freshness check (how long a join has waited for it)."
                           if freshness is not None else "."))
    def _on_demand(context: SensorEvaluationContext):
        lake = getattr(context.resources, LAKE_KEY).lake()
        why = source_wanted(lake, graph, pid)
        states = [input_state(family_work(lake, graph, j), graph) for j in joins]
        body = "+".join(f"{q}.o{e}" for ends, _ in states for q, e in sorted(ends.items()))
        read = sum(r for _, r in states)
        cursor = json.dumps({"ends": [e for e, _ in states], "read": read}, sort_keys=True)
        events: list[Any] = []
        if freshness is not None:
            verdict = evaluate(lake, graph, pid, freshness)
            events, _ = sensor_report(verdict, keys, last_reported(context, keys[0]), sensor=name)
        if not why:
            return SensorResult(skip_reason=SkipReason(
                f"no join waits for {pid!r} ({', '.join(joins)} read every row it has, or has "
                "unread rows of its output)"), cursor=cursor, asset_events=events)
        request = RunRequest(run_key=_short(pid, f"for.{body}+read.{read}"), asset_selection=keys,
                             tags={TRIGGER_TAG: "on_demand", "cues/processor": pid,
                                   "cues/waiting": why[:200]})
        return SensorResult(run_requests=[request], cursor=cursor, asset_events=events)

    return _on_demand


def joined_sources(graph: Graph) -> list[str]:
    """The graph's source processors read by a join (each gets an on-demand sensor)."""
    out = []
    for family in graph.family_order():
        proc = graph.as_declared(family)
        outs = {o.queue for o in proc.outputs.values()}
        if proc.kind is Kind.SOURCE and any(p.kind is Kind.JOIN and any(i.queue in outs for i in p.inputs.values())
                                            for p in graph.processors.values()):
            out.append(family)
    return out


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


def recovery_job_name(graph: Graph) -> str:
    """``{graph}__recover``: the job the recovery sensor's runs carry (a subset of it)."""
    return f"{graph.name}__recover"


def build_recovery_sensor(graph: Graph, *, prefix: Sequence[str] = (), max_attempts: int = 3,
                          minimum_interval_seconds: int = 30,
                          default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
                          freshness: bool = False) -> Any:
    """``freshness``: the graph has ``freshness`` checks, which the recovery job leaves out."""
    ours: set[AssetKey] = {k for p in graph.processors.values() for k in processor_keys(p, prefix)}
    fresh = freshness_check_keys(graph, prefix=prefix) if freshness else []

    job = define_asset_job(recovery_job_name(graph), selection=without_freshness(AssetSelection.assets(*ours), fresh),
                           description=f"recovery runs of graph {graph.name!r}: the processor assets a "
                                       "failed run did not materialize",
                           tags={"cues/graph": graph.name})

    @sensor(name=f"{graph.name}__recovery", target=job,
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
                  default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
                  freshness: Freshness | None = None) -> list[Any]:
    """The graph's sensors; with ``freshness``, each new-data/sink/on-demand sensor also reports
    the ``freshness`` check of its processor's assets (``freshness.py``)."""
    checked = set(freshness_processors(graph)) if freshness is not None else set()
    # every sensor's processor is in ``checked`` when freshness is on (inputs, or a joined source)
    out = [build_new_data_sensor(graph, graph.as_declared(pid), prefix=prefix,
                                 minimum_interval_seconds=minimum_interval_seconds,
                                 default_status=default_status,
                                 freshness=freshness if pid in checked else None)
           for pid in graph.family_order() if graph.as_declared(pid).inputs]
    out += [build_on_demand_sensor(graph, graph.as_declared(pid), prefix=prefix,
                                   minimum_interval_seconds=minimum_interval_seconds,
                                   default_status=default_status,
                                   freshness=freshness if pid in checked else None)
            for pid in joined_sources(graph)]
    out.append(build_recovery_sensor(graph, prefix=prefix, max_attempts=max_recovery_attempts,
                                     minimum_interval_seconds=minimum_interval_seconds,
                                     default_status=default_status, freshness=freshness is not None))
    return out
