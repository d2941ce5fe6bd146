"""``build_definitions(graph)``: a graph's Dagster definitions, complete with default resources."""

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    AssetKey,
    AssetSelection,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    RetryPolicy,
    RunRequest,
    ScheduleEvaluationContext,
    SkipReason,
    define_asset_job,
    schedule,
)

from cues_platform.dagster.assets import (
    BACKING_KEY,
    IO_MANAGER_KEY,
    LAKE_KEY,
    SPARK_KEY,
    build_processor_asset,
    external_queues,
    external_spec,
    processor_keys,
    queue_key,
)
from cues_platform.dagster.checks import build_checks
from cues_platform.dagster.error_queues import error_queue_spec, error_queue_writers
from cues_platform.dagster.freshness import (
    Freshness,
    build_freshness_checks,
    freshness_check_keys,
    without_freshness,
)
from cues_platform.dagster.io_manager import CuesIOManager
from cues_platform.dagster.replay_job import build_replay_job
from cues_platform.dagster.resources import BackingQueueResource, CuesSparkResource, LakeResource
from cues_platform.dagster.sensors import TRIGGER_TAG, build_sensors, joined_sources
from cues_platform.dagster.step_io import STEP_IO_KEY, CuesStepIOManager
from cues_platform.processing.errors import GraphError
from cues_platform.processing.graph import AssetBody, Graph, Kind
from cues_platform.processing.idle import graph_work
from cues_platform.settings import current

RESERVED_KEYS = (LAKE_KEY, SPARK_KEY, BACKING_KEY, IO_MANAGER_KEY, STEP_IO_KEY)
DEFAULT_FRESHNESS = Freshness()


def all_job_name(graph: Graph) -> str:
    return f"{graph.name}__all"


def schedule_name(graph: Graph) -> str:
    return f"{graph.name}__schedule"


def build_definitions(
    graph: Graph,
    *,
    lake: LakeResource | None = None,
    spark: Any = None,
    resources: Mapping[str, Any] | None = None,
    group_name: str | None = None,
    schedule_cron: str | None = "*/15 * * * *",
    retry_policy: RetryPolicy | None = None,
    key_prefix: Sequence[str] = (),
    sensor_interval_seconds: int | None = None,
    max_recovery_attempts: int = 3,
    automation: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    producers: Mapping[str, Sequence[AssetKey]] | None = None,
    freshness: Freshness | None = DEFAULT_FRESHNESS,
) -> Definitions:
    """Dagster definitions of ``graph``.

    - one ``multi_asset`` per processor (op name = processor id), one asset per output queue (key
      ``[*key_prefix, queue]``), a sink/imperative without outputs as one asset named after it;
    - external input queues as external ``AssetSpec``s; lineage from the topology, and from
      ``producers`` (``{queue: [asset keys outside the graph that write it]}``) into them;
    - each error queue as an ``AssetSpec`` with an edge from every processor that writes it
      (observed with its rows by processor and reason after each of their materializations);
    - blocking asset checks (``contract``, ``exactly_once``) per processor output;
    - a new-data sensor per processor with inputs (sink sensors for sinks), a recovery sensor
      (for instances without run retries), every ``sensor_interval_seconds`` (default: the setting
      ``CUES_SENSOR_INTERVAL``, 30 s);
    - unless ``freshness`` is None, a non-blocking ``freshness`` check on the assets of every
      processor with inputs and every source a join reads: the age of its oldest unread row, from
      the queues, reported by its sensor without a run (``freshness.py``; default thresholds WARN
      above 15 minutes, ERROR above 1 hour);
    - the job ``{graph}__all`` of every processor asset and, unless ``schedule_cron`` is None, the
      schedule ``{graph}__schedule`` running it;
    - ``automation``: the default status of every sensor and the schedule (RUNNING: the daemon
      ticks them as soon as the code location loads; STOPPED: turned on in the UI);
    - resources: ``lake`` (default ``LakeResource()``: $CUES_LAKE or ./lake), ``spark`` (default
      ``CuesSparkResource()``: local[*] or $CUES_SPARK_MASTER; any dagster-pyspark resource or a
      bare SparkSession works) and ``cues_io_manager``. ``resources`` adds more (or
      replaces these); every extra resource is also handed to processor functions as
      ``ctx.resources[key]``.
    """
    lake_res = lake if lake is not None else LakeResource()
    spark_res = spark if spark is not None else CuesSparkResource()
    extra = dict(resources or {})
    lake_res = extra.get(LAKE_KEY, lake_res)
    spark_res = extra.get(SPARK_KEY, spark_res)
    res: dict[str, Any] = {LAKE_KEY: lake_res, SPARK_KEY: spark_res}
    if isinstance(lake_res, LakeResource):
        res[IO_MANAGER_KEY] = CuesIOManager(lake=lake_res, spark=spark_res)
        # the one way a step (either face) reaches its backing queue
        backing = BackingQueueResource(lake=lake_res)
        res[BACKING_KEY] = backing
        if any(p.asset_body is AssetBody.FUNCTION for p in graph.processors.values()):
            res[STEP_IO_KEY] = CuesStepIOManager(lake=lake_res, spark=spark_res, backing=backing)
    res.update(extra)
    user_keys = sorted(k for k in extra if k not in RESERVED_KEYS)
    prefix = tuple(key_prefix)

    unknown = sorted(set(producers or {}) - set(external_queues(graph)))
    if unknown:
        raise GraphError(f"graph {graph.name!r}: producers given for {unknown}, which are not external "
                         f"input queues (those are {sorted(external_queues(graph))})")
    externals = [external_spec(graph, q, prefix=prefix, group_name=group_name,
                               producers=(producers or {}).get(q, ()))
                 for q in external_queues(graph)]
    assets = [build_processor_asset(graph, graph.as_declared(pid), prefix=prefix,
                                    group_name=group_name, retry_policy=retry_policy,
                                    runner_resource_keys=user_keys)
              for pid in graph.family_order()]
    external_names = set(external_queues(graph))
    errors = [error_queue_spec(graph, name, [k for pid in writers
                                             for k in processor_keys(graph.as_declared(pid), prefix)],
                               key=queue_key(name, prefix), group_name=group_name)
              for name, writers in error_queue_writers(graph).items()
              if name not in external_names]  # read by a processor: already an external asset
    _check_unique_keys(graph, prefix, {s.key for s in [*externals, *errors]})
    keys = [k for pid in graph.family_order() for k in processor_keys(graph.as_declared(pid), prefix)]
    # the error queues' checks too: after a run of the job, no_platform_errors says something
    # (it stayed "Not evaluated" after `cues demo`, whose runs are this job's)
    selection = AssetSelection.assets(*keys) | AssetSelection.checks_for_assets(*[s.key for s in errors])
    # the freshness checks are reported by the sensors, without a run: the job leaves them out
    fresh = freshness_check_keys(graph, prefix=prefix) if freshness is not None else []
    selection = without_freshness(selection, fresh)
    job = define_asset_job(all_job_name(graph), selection=selection,
                           description=f"every processor asset of graph {graph.name!r} and the "
                                       "checks of its error queues",
                           tags={"cues/graph": graph.name})
    schedules = []
    if schedule_cron:
        schedules.append(build_schedule(graph, job, schedule_cron, schedule_status(automation)))
    interval = sensor_interval_seconds if sensor_interval_seconds is not None else current().sensor_interval
    checks = build_checks(graph, prefix=prefix)
    replay = build_replay_job(graph, prefix=prefix, runner_resource_keys=user_keys)
    if freshness is not None:
        checks = [*checks, *build_freshness_checks(graph, prefix=prefix, freshness=freshness)]
    return Definitions(
        assets=[*externals, *errors, *assets],
        asset_checks=checks,
        sensors=build_sensors(graph, prefix=prefix, minimum_interval_seconds=interval,
                              max_recovery_attempts=max_recovery_attempts, default_status=automation,
                              freshness=freshness),
        schedules=schedules,
        jobs=[job, *([replay] if replay is not None else [])],
        resources=res,
    )


def build_schedule(graph: Graph, job: Any, cron: str, status: DefaultScheduleStatus) -> Any:
    """The schedule ``{graph}__schedule``: a run of ``{graph}__all`` at each tick where some
    processor has work (``processing/idle.py``: unread rows, a step to recover, a join waiting for
    its source) or the graph has a source no join reads (whose work only its function knows); a
    drained lake gets a skip, not a run."""
    free = [p for p in graph.family_order() if graph.as_declared(p).kind in (Kind.SOURCE, Kind.IMPERATIVE)
            and p not in joined_sources(graph)]

    @schedule(name=schedule_name(graph), cron_schedule=cron, job=job, default_status=status,
              required_resource_keys={LAKE_KEY},
              description=f"runs graph {graph.name!r} when a processor has work (never on a drained lake)")
    def _schedule(context: ScheduleEvaluationContext):
        if free:
            return RunRequest(tags={TRIGGER_TAG: "schedule", "cues/sources": ",".join(free)})
        work = graph_work(getattr(context.resources, LAKE_KEY).lake(), graph)
        if not work:
            return SkipReason(f"graph {graph.name!r}: every processor has read its input and has nothing "
                              "to recover (drained)")
        return RunRequest(tags={TRIGGER_TAG: "schedule",
                                "cues/work": "; ".join(f"{p}: {w}" for p, w in work.items())[:250]})

    return _schedule


def schedule_status(automation: DefaultSensorStatus) -> DefaultScheduleStatus:
    return DefaultScheduleStatus.RUNNING if automation is DefaultSensorStatus.RUNNING else DefaultScheduleStatus.STOPPED


def _check_unique_keys(graph: Graph, prefix: tuple[str, ...], external: set) -> None:
    seen: dict[Any, str] = {k: "external or error queue" for k in external}
    for pid in graph.family_order():
        for key in processor_keys(graph.as_declared(pid), prefix):
            if key in seen:
                raise GraphError(
                    f"graph {graph.name!r}: asset key {key.to_user_string()} of processor {pid!r} "
                    f"is also the key of {seen[key]}; rename the processor or the queue",
                    processor=pid)
            seen[key] = f"processor {pid!r}"
