"""The Dagster face of maintenance: a job that maintains every queue of a lake, and its schedule.

``build_maintenance_definitions()`` contributes, for the lake resource under ``lake_key``:

- the job ``cues_maintenance`` (one op, ``maintain_queues``) that runs
  :func:`cues_platform.processing.retention.maintain_queue` -- what ``cues queue maintain`` runs:
  abort transactions past their timeout, digest a processor home, apply the queue's retention,
  then compact, checkpoint and vacuum -- on every user queue of the lake (``Lake.list_queues()``,
  or the queues named in the run config), one after the other. Each queue's retention report and
  maintenance reports go to the run's log; the op's output metadata says, per queue, the offsets
  retention removed and the files compaction rewrote and vacuum deleted.
- the schedule ``cues_maintenance__schedule`` (daily at 03:00 UTC, vacuum retention 24 h as the
  CLI's default).

One op, not one op per queue: the queues are only known by listing the lake, which loading the
definitions must not do, and the reference deployment runs every job in one process anyway. A
queue whose maintenance fails does not stop the others: each failure is logged with its message
when it happens, and once every queue had its turn the op fails (``dagster.Failure``) naming
every failed queue, its error and whether running again can help (``retryable``: e.g. a lost
commit race). A failed maintenance is a red run, never a green one. Maintenance changes nothing
a reader sees (retention only removes what every registered reader has read), so running the
job again, whole or for the failed queues only (``queues`` in the run config), is always safe.
"""

from typing import Any

from dagster import (
    Config,
    DefaultScheduleStatus,
    Definitions,
    Failure,
    MetadataValue,
    Nothing,
    OpExecutionContext,
    Out,
    Output,
    RunConfig,
    ScheduleDefinition,
    job,
    op,
)
from pydantic import Field

from cues_platform.dagster.assets import LAKE_KEY
from cues_platform.dagster.resources import LakeResource
from cues_platform.errors import CuesError
from cues_platform.processing.retention import maintain_queue, maintain_system_tables
from cues_platform.queues.maintenance import (
    DEFAULT_VACUUM_RETENTION_HOURS,
    MIN_SAFE_RETENTION_HOURS,
    MaintenanceReport,
    retention_whole_hours,
)

MAINTENANCE_JOB = "cues_maintenance"
MAINTENANCE_OP = "maintain_queues"
MAINTENANCE_CRON = "0 3 * * *"  # daily, 03:00 UTC


def maintenance_schedule_name(job_name: str = MAINTENANCE_JOB) -> str:
    return f"{job_name}__schedule"


def maintenance_op_name(lake_key: str = LAKE_KEY) -> str:
    """``maintain_queues`` for the resource ``lake``, ``maintain_queues__{lake_key}`` for another
    (op names are unique in a code location); the run config goes under it."""
    return MAINTENANCE_OP if lake_key == LAKE_KEY else f"{MAINTENANCE_OP}__{lake_key}"


def maintenance_pool(lake_key: str = LAKE_KEY) -> str:
    """The concurrency pool of the maintenance op: with a limit of 1 (``concurrency: {pools:
    {default_limit: 1}}`` in dagster.yaml), a second maintenance run of the same lake waits
    instead of racing the first one's commits."""
    return f"cues__maintenance__{lake_key}"


class MaintenanceConfig(Config):
    """Run config of the maintenance op (launchpad: ``ops: {maintain_queues: {config: ...}}``;
    the op of another lake resource is ``maintain_queues__{lake_key}``)."""

    retention_hours: float = Field(
        default=float(DEFAULT_VACUUM_RETENTION_HOURS),
        description="vacuum keeps files removed from the queues this long (as `cues queue "
                    "maintain --retention-hours`; fractions round up to whole hours; under "
                    f"{MIN_SAFE_RETENTION_HOURS:g} h refused unless unsafe_allow_short_retention)")
    unsafe_allow_short_retention: bool = Field(
        default=False,
        description="allow a vacuum retention under the safe minimum: only when no one writes to "
                    "or reads the queues (a slow reader may lose files it is reading)")
    queues: list[str] | None = Field(
        default=None,
        description="maintain only these queues (default: every queue of the lake), e.g. the "
                    "ones a failed run named")


def describe_maintenance(report: MaintenanceReport) -> str:
    """One maintenance step of a queue in words (the CLI prints the dataclass)."""
    parts = []
    if report.files_removed or report.files_added:
        parts.append(f"compacted {report.files_removed} file(s) into {report.files_added}")
    if report.checkpoint_version is not None:
        parts.append(f"checkpoint at version {report.checkpoint_version}, "
                     f"{report.log_entries_removed} expired log entr(ies) removed")
    if report.staged_removed:
        parts.append(f"{report.staged_removed} staged checkpoint file(s) of a crashed writer removed")
    if report.vacuum_hours is not None:
        parts.append(f"vacuumed {report.files_vacuumed} file(s) (files older than "
                     f"{report.vacuum_hours} h by the real clock)")
    return f"{report.queue}: " + ("; ".join(parts) if parts else "nothing to compact")


def _failure_text(exc: BaseException) -> str:
    if isinstance(exc, CuesError):
        again = "retryable: run again" if exc.retryable else "not retryable as is: fix it first"
        return f"{type(exc).__name__}: {exc} ({again})"
    return (f"{type(exc).__name__}: {exc} (unexpected: a bug or an untranslated storage error; "
            "the traceback is in the run's log)")


def build_maintenance_op(*, lake_key: str = LAKE_KEY) -> Any:
    @op(name=maintenance_op_name(lake_key), required_resource_keys={lake_key}, out=Out(Nothing),
        pool=maintenance_pool(lake_key), tags={"cues/maintenance": lake_key},
        description=f"abort expired transactions, apply retention, compact, checkpoint and vacuum "
                    f"every queue of the lake resource {lake_key!r} (`cues queue maintain` on each)")
    def _maintain(context: OpExecutionContext, config: MaintenanceConfig) -> Output:
        resource: LakeResource = getattr(context.resources, lake_key)
        lake = resource.lake()
        names = sorted(set(config.queues)) if config.queues is not None else lake.list_queues()
        # the vacuum retention is the run's setting, not a queue's: refused before any queue changes
        retention_whole_hours(f"(every queue of lake {lake.root})", config.retention_hours,
                              unsafe=config.unsafe_allow_short_retention)
        context.log.info(f"maintaining {len(names)} queue(s) of lake {lake.root}: "
                         f"{', '.join(names) or 'none'}")
        done: dict[str, dict[str, Any]] = {}
        failed: dict[str, str] = {}
        for queue_name in names:
            try:
                queue = lake.queue(queue_name)
                retained, reports = maintain_queue(
                    queue, retention_hours=config.retention_hours,
                    unsafe_allow_short_retention=config.unsafe_allow_short_retention)
            except Exception as exc:  # noqa: BLE001 -- recorded, and the op fails at the end
                failed[queue_name] = _failure_text(exc)
                if isinstance(exc, CuesError):
                    context.log.error(f"{queue_name}: maintenance failed: {failed[queue_name]}")
                else:
                    context.log.exception(f"{queue_name}: maintenance failed: {failed[queue_name]}")
                continue
            for line in retained.lines():
                context.log.info(line)
            for report in reports:
                context.log.info(describe_maintenance(report))
            done[queue_name] = {
                "offsets_removed": retained.removed_offsets,
                "start_offsets": {p.partition: p.new_start for p in retained.partitions},
                "tailers_moved": len(retained.moved_tailers),
                "files_compacted": sum(r.files_removed for r in reports),
                "files_vacuumed": sum(r.files_vacuumed for r in reports),
            }
        try:  # the busy system tables (positions, the coordinator): once per run
            system = maintain_system_tables(
                lake, retention_hours=config.retention_hours,
                unsafe_allow_short_retention=config.unsafe_allow_short_retention)
            for table, merged in system.items():
                context.log.info(f"system table {table}: {merged} small file(s) compacted")
        except Exception as exc:  # noqa: BLE001 -- recorded, and the op fails at the end
            failed["(system tables)"] = _failure_text(exc)
            context.log.error(f"system tables: maintenance failed: {failed['(system tables)']}")
        metadata: dict[str, Any] = {
            "lake": lake.root,
            "queues_maintained": len(done),
            "queues_failed": len(failed),
            "offsets_removed": sum(d["offsets_removed"] for d in done.values()),
            "files_vacuumed": sum(d["files_vacuumed"] for d in done.values()),
            "by_queue": MetadataValue.json(done),
        }
        if failed:
            metadata["failed"] = MetadataValue.json(failed)
            listing = "; ".join(f"{q!r}: {why}" for q, why in failed.items())
            raise Failure(
                description=(f"maintenance failed for {len(failed)} of {len(names)} queue(s) of "
                             f"lake {lake.root}: {listing}. The other queues were maintained. Fix "
                             "what each message says, then run the job again (run config "
                             f"queues: {sorted(failed)} maintains only these)"),
                metadata=metadata)
        return Output(None, metadata=metadata)

    return _maintain


def build_maintenance_definitions(
    *,
    lake_key: str = LAKE_KEY,
    lake: LakeResource | None = None,
    job_name: str = MAINTENANCE_JOB,
    cron: str | None = MAINTENANCE_CRON,
    default_status: DefaultScheduleStatus = DefaultScheduleStatus.RUNNING,
    retention_hours: float = DEFAULT_VACUUM_RETENTION_HOURS,
) -> Definitions:
    """The maintenance job of the lake resource ``lake_key`` and, unless ``cron`` is None, its
    schedule ``{job_name}__schedule`` (run config: ``retention_hours``, default 24 h as the CLI).

    ``lake``: the resource, when these definitions are not merged with others that hold it (a
    root merging several ``Definitions`` must hand them all the same instance, as the reference
    deployment's ``resources/`` does).

    The schedule is RUNNING by default, like every sensor and schedule ``build_definitions``
    makes: maintenance is what keeps a lake bounded (retention, compaction, log checkpoints,
    vacuum), and it is safe unattended -- retention never removes a row a registered reader still
    needs, vacuum keeps what readers opened within ``retention_hours``, and a queue without a
    retention policy keeps every row. A lake whose maintenance waits for someone to turn it on
    grows for ever, silently; a failed maintenance run is red. Pass
    ``default_status=DefaultScheduleStatus.STOPPED`` to turn it on in the UI instead.
    """
    maintain = build_maintenance_op(lake_key=lake_key)

    @job(name=job_name, tags={"cues/maintenance": lake_key},
         description=f"maintain every queue of the lake resource {lake_key!r}: retention, then "
                     "compaction, checkpoint and vacuum (as `cues queue maintain`)")
    def _job() -> None:
        maintain()

    schedules = []
    if cron is not None:
        schedules.append(ScheduleDefinition(
            name=maintenance_schedule_name(job_name), cron_schedule=cron, job=_job,
            run_config=RunConfig(ops={maintenance_op_name(lake_key): MaintenanceConfig(
                retention_hours=float(retention_hours))}),
            default_status=default_status,
            description=f"maintains every queue of {lake_key!r} ({cron}, UTC)"))
    return Definitions(jobs=[_job], schedules=schedules,
                       resources={lake_key: lake} if lake is not None else None)


__all__ = ["MAINTENANCE_CRON", "MAINTENANCE_JOB", "MAINTENANCE_OP", "MaintenanceConfig",
           "build_maintenance_definitions", "build_maintenance_op", "describe_maintenance",
           "maintenance_op_name", "maintenance_pool", "maintenance_schedule_name"]
