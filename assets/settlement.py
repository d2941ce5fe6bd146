"""The daily settlement report: each participant's net position per value date.

Partitioned by value date, over the days that exist: the dynamic partitions ``settlement_days``
hold exactly the value dates found in ``results`` (the sensor ``settlement_days`` adds a day the
first time a result carries it; :func:`add_report_days` does the same for a caller without the
daemon, such as ``cues demo``). No day without traffic shows as *Missing*.

It reads ``results`` through the platform's IO manager (the queue, all subjects, as Arrow) and
writes through it too: each materialization REPLACES its day(s) in one Delta commit, so
re-running a failed or late day — ``dagster asset materialize -f definitions.py --select
settlement_report --partition 2026-11-21`` or a backfill in the UI — gives the same report, never
doubled, and leaves other days untouched. A backfill of several days is one run
(``BackfillPolicy.single_run()``): one read of ``results``, one commit replacing those days.

Automation (``AutomationCondition.eager()``, evaluated by the sensor
``settlement_report_automation``, on by default): a newly added day runs once it appears, and every
day runs again after ``results`` is updated (late postings change earlier days; a day's report is
a pure function of the results, so a day that did not change is replaced by the same rows).
Freshness: a report older than a day warns at 12 hours and fails at 24 (``dagster.yaml`` enables
freshness policies): with traffic every day, a stale report means the automation is not running.
"""


from datetime import date, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dagster import (
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    BackfillPolicy,
    DagsterInstance,
    DefaultSensorStatus,
    Definitions,
    DynamicPartitionsDefinition,
    FreshnessPolicy,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset,
    sensor,
)

from cues_platform.dagster import IO_MANAGER_KEY, LakeResource
from cues_platform.dagster.io_manager import PARTITION_COLUMN
from cues_platform.queues import Lake
from cues_platform.reference.report import settlement_report as compute_report

RESULTS = "results"
DAYS = DynamicPartitionsDefinition(name="settlement_days")
FRESHNESS = FreshnessPolicy.time_window(fail_window=timedelta(hours=24), warn_window=timedelta(hours=12))


def value_dates(lake: Lake) -> list[str]:
    """The value dates (ISO) of every committed row of ``results``, sorted; [] while the queue does
    not exist. Reads one column."""
    if not lake.has_queue(RESULTS):
        return []
    queue = lake.queue(RESULTS)
    days: set[date] = set()
    for partition in queue.partitions:
        column = queue.read_arrow(partition=partition, columns=["value_date"])["value_date"]
        days.update(d for d in pc.unique(column).to_pylist() if d is not None)
    return sorted(d.isoformat() for d in days)


def add_report_days(instance: DagsterInstance, lake: Lake) -> list[str]:
    """Add to ``settlement_days`` the value dates of ``results`` it lacks; returns those added."""
    new = [d for d in value_dates(lake) if not instance.has_dynamic_partition(DAYS.name, d)]
    if new:
        instance.add_dynamic_partitions(DAYS.name, new)
    return new


@sensor(name="settlement_days", minimum_interval_seconds=60,
        default_status=DefaultSensorStatus.RUNNING,
        description="Adds a partition of settlement_report for each value date that appears in "
                    "results (it reads the queue's value_date column only when the queue changed).")
def settlement_days(context: SensorEvaluationContext, lake: LakeResource) -> SensorResult | SkipReason:
    the_lake = lake.lake()
    if not the_lake.has_queue(RESULTS):
        return SkipReason(f"no {RESULTS!r} queue in {the_lake.root} yet")
    version = str(the_lake.queue(RESULTS).version())
    if context.cursor == version:
        return SkipReason(f"{RESULTS!r} unchanged since version {version}")
    known = set(context.instance.get_dynamic_partitions(DAYS.name))
    new = [d for d in value_dates(the_lake) if d not in known]
    return SensorResult(cursor=version,
                        dynamic_partitions_requests=[DAYS.build_add_request(new)] if new else [])


@asset(
    partitions_def=DAYS,
    ins={"results": AssetIn(key=AssetKey([RESULTS]))},
    io_manager_key=IO_MANAGER_KEY,
    group_name="reports",
    kinds={"python", "delta"},
    metadata={"cues/partition_column": PARTITION_COLUMN},
    backfill_policy=BackfillPolicy.single_run(),
    automation_condition=AutomationCondition.eager(),
    freshness_policy=FRESHNESS,
)
def settlement_report(context: AssetExecutionContext, results: pa.Table) -> pa.Table:
    """Per participant and value date: postings sent and received (count, EUR) and the net position
    (received - sent) from the OK results; each day's positions sum to zero."""
    keys = sorted(context.partition_keys)
    reports = [compute_report(results, date.fromisoformat(k)) for k in keys]
    tables = [r.append_column(PARTITION_COLUMN, pa.array([k] * r.num_rows, pa.string()))
              for k, r in zip(keys, reports, strict=True)]
    report = pa.concat_tables(tables)
    context.add_output_metadata(report_metadata(keys, reports))
    return report


def report_metadata(keys: list[str], reports: list[pa.Table]) -> dict[str, Any]:
    """One day: its value date, participants, settled postings and net positions; several days
    (a backfill run, whose metadata every day's materialization shares): the same by day."""
    def nets(report: pa.Table) -> dict[str, float]:
        return {r["participant"]: float(r["net_position"]) for r in report.to_pylist()}

    settled = [int(sum(r["sent_count"].to_pylist())) for r in reports]
    if len(keys) == 1:
        return {"value_date": keys[0], "participants": reports[0].num_rows,
                "settled_postings": settled[0], "net_positions": nets(reports[0])}
    return {"value_dates": keys, "participants": {k: r.num_rows for k, r in zip(keys, reports, strict=True)},
            "settled_postings": dict(zip(keys, settled, strict=True)),
            "net_positions": {k: nets(r) for k, r in zip(keys, reports, strict=True)}}


# The sensor that evaluates the report's automation condition, on by default like every sensor of
# the deployment (without it Dagster adds its own default one, which starts stopped). It is the
# only automation-condition sensor of the deployment: an asset may be targeted by only one.
settlement_automation = AutomationConditionSensorDefinition(
    "settlement_report_automation", target=[settlement_report], minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="Runs settlement_report's days when they appear and again after results change "
                "(AutomationCondition.eager()).")

defs = Definitions(assets=[settlement_report], sensors=[settlement_days, settlement_automation])
