"""Postings protocol participants in Dagster (group ``participants``).

Per participant: one asset whose materialization runs ONE bounded pass of its work in process
(``cues_platform.participants.once.run_once``: the same instance code, leases and delivery
contract as ``cues participant run``; a producer publishes what is pending and applies the
results; a consumer processes its POSTINGS subject until drained through its exactly-once
processor, on the run's Spark session) and reports its counts by status; the asset check
``no_consistency_issues``, which FAILS while its database holds a consistency issue (a result for
an unknown message, a duplicate or malformed result); and a sensor on its input queue (sensors in
``participants_sensors.py``; each sensor's runs carry the job ``participants__<id>``). A job
``participants__all`` and its schedule run every pass when some participant has work, which is also
what publishes postings recorded while no result arrives.

What the schedule calls work (:func:`participant_work`), and why it can say "nothing": a
consumer's pass steps its exactly-once processor ``consume-<id>`` until POSTINGS subject ``<id>`` is
drained, so it has work exactly when that lane has (unread rows or a step to recover), which the
lake's Delta logs say (``processing/idle.py``). A producer's pass publishes the postings its
database holds unacked (``nacked_posting``: recorded by the application straight into the
database, which no queue shows) and applies the RESULTS rows after its subscription position (also
in the database): so the schedule asks the database, read-only (``SELECT``, never creating it): a
producer with no database has recorded nothing. When the database cannot be asked (unreachable,
not migrated, any error), the schedule cannot prove there is nothing to do and runs, saying why.

Which participants: ``participant_defs(...)`` with a mapping ``{id: dsn or None}`` (producers) or
:class:`ParticipantConfig` s; by default ``$CUES_PARTICIPANTS`` (``bank-a:producer,bank-x:consumer``,
optionally ``id:role:slots``), else ``bank-a`` (producer) and ``bank-x`` (consumer) as in
docs/postings-protocol.md. A participant's DSN comes from the config, else
``CUES_PARTICIPANT_DSN_<ID>`` (upper case, '-' → '_'), else its database on the embedded server
under ``CUES_PARTICIPANTS_DATA`` (default ``.cues/participants``, the CLI's ``--data-dir``).
The queues live in the resource ``participants_lake`` (``$CUES_PARTICIPANTS_LAKE``, default
``lake-participants``): the payments graph has its own ``postings``/``results`` queues with other
schemas. Loading these definitions touches neither a database nor the lake.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetSelection,
    Config,
    DefaultSensorStatus,
    Definitions,
    MaterializeResult,
    MetadataValue,
    RunRequest,
    ScheduleEvaluationContext,
    SkipReason,
    asset,
    asset_check,
    define_asset_job,
    schedule,
)
from pydantic import Field

from cues_platform.participants.errors import ParticipantConfigError
from cues_platform.participants.model import Role
from cues_platform.settings import current, secret

PARTICIPANTS_ENV = "CUES_PARTICIPANTS"
DEFAULT_PARTICIPANTS = "bank-a:producer,bank-x:consumer"
PARTICIPANTS_LAKE_KEY = "participants_lake"
SPARK_KEY = "spark"
GROUP = "participants"
JOB_NAME = "participants__all"
SCHEDULE_NAME = "participants__schedule"


@dataclass(frozen=True)
class ParticipantConfig:
    id: str
    role: Role
    dsn: str | None = None  # never logged; None: $CUES_PARTICIPANT_DSN_<ID> or the embedded server
    slots: int = 1  # a producer pass claims one free slot among these (as an instance would)


def parse_participants(text: str) -> list[ParticipantConfig]:
    """``bank-a:producer,bank-x:consumer[:slots]`` → configs (validated, no I/O)."""
    from cues_platform.participants.network import validate_participant

    out: list[ParticipantConfig] = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError("expected id:role or id:role:slots")
            slots = int(parts[2]) if len(parts) == 3 else 1
            if slots < 1:
                raise ValueError("slots must be >= 1")
            role = Role(parts[1].strip())
        except ValueError as exc:
            raise ParticipantConfigError(f"{PARTICIPANTS_ENV}: bad entry {item!r} ({exc})",
                                         entry=item) from exc
        out.append(ParticipantConfig(validate_participant(parts[0].strip()), role, slots=slots))
    if len({p.id for p in out}) != len(out):
        raise ParticipantConfigError(f"{PARTICIPANTS_ENV}: a participant is listed twice: {text!r}")
    # asset keys and $CUES_PARTICIPANT_DSN_<ID> write '-' as '_': ids equal but for that collide
    by_key: dict[str, str] = {}
    for p in out:
        key = p.id.replace("-", "_")
        if key in by_key:
            raise ParticipantConfigError(
                f"{PARTICIPANTS_ENV}: {by_key[key]!r} and {p.id!r} would share the asset key "
                f"{asset_key(p.id).to_user_string()!r} and the variable "
                f"CUES_PARTICIPANT_DSN_{key.upper()}; deploy at most one of them", entry=p.id)
        by_key[key] = p.id
    return out


def configured_participants() -> list[ParticipantConfig]:
    """``$CUES_PARTICIPANTS`` (through ``cues_platform.settings``) or DEFAULT_PARTICIPANTS."""
    return parse_participants((current().participants or "").strip() or DEFAULT_PARTICIPANTS)


def asset_key(participant: str) -> AssetKey:
    return AssetKey(f"participant_{participant.replace('-', '_')}_messages")


def participant_job_name(participant: str) -> str:
    """``participants__<id>`` ('-' as '_'): the job of one participant's asset, the name its
    sensor's runs carry (a run of an asset selection alone is ``__anonymous_asset_job_...``)."""
    return f"{GROUP}__{participant.replace('-', '_')}"


def _never(ctx: object, postings: object) -> None:  # noqa: ARG001 - the lane's shape only
    raise AssertionError("the schedule reads the consumer lane's positions; it never steps it")


def consumer_lane(participant: str):  # noqa: ANN201 - a Processor
    """The shape of consumer ``participant``'s exactly-once processor (``ConsumerInstance.graph``:
    id, input, home queue), enough to read its positions and recovery state from the lake."""
    from cues_platform.participants.model import POSTINGS, RESULTS
    from cues_platform.processing import In, Kind, Out, Processor

    return Processor(id=f"consume-{participant}", kind=Kind.MAP, fn=_never,
                     inputs={"postings": In(POSTINGS, participant)},
                     outputs={"results": Out(RESULTS, partition=None, partition_column="sender")})


def participant_work(lake, p: ParticipantConfig) -> str:  # noqa: ANN001 - a Lake
    """Why a pass of ``p`` has something to do now (empty: provably nothing; module docstring)."""
    from cues_platform.participants.model import RESULTS
    from cues_platform.processing.idle import lane_work

    if p.role is Role.CONSUMER:
        work = lane_work(lake, consumer_lane(p.id))
        if work.pending:
            return f"consumer {p.id}: {work.pending}"
        return f"consumer {p.id}: {work.lag} unread posting(s)" if work.lag else ""
    import psycopg

    from cues_platform.participants.db import participant_dsn
    from cues_platform.participants.errors import MissingDatabaseError

    env = secret(f"CUES_PARTICIPANT_DSN_{p.id.upper().replace('-', '_')}")  # never logged
    try:
        dsn = participant_dsn(p.id, dsn=p.dsn or env, data_dir=current().participants_data, create=False)
    except MissingDatabaseError:
        return ""  # no database: nothing was ever recorded, nothing published, no result awaited
    end = 0
    if lake.has_queue(RESULTS) and p.id in lake.queue(RESULTS).partitions:
        end = lake.queue(RESULTS).next_offset(p.id)
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            (nacked,) = conn.execute(
                "SELECT count(*) FROM messages WHERE ack_status = 'nacked_posting'").fetchone()
            row = conn.execute("SELECT position FROM subscriptions WHERE queue = %s AND partition = %s",
                               (RESULTS, p.id)).fetchone()
    except psycopg.Error as exc:
        return (f"producer {p.id}: its database could not be asked ({type(exc).__name__}), so it may "
                "hold postings to publish")
    position = int(row[0]) if row is not None else 0
    why = []
    if nacked:
        why.append(f"{nacked} posting(s) recorded and not acked")
    if end > position:
        why.append(f"{end - position} result(s) on {RESULTS} after its position {position}")
    return f"producer {p.id}: {', '.join(why)}" if why else ""


def build_participants_schedule(configs: Sequence[ParticipantConfig], job, cron: str,  # noqa: ANN001
                                status) -> object:  # noqa: ANN001
    """The schedule ``participants__schedule``: a run of ``participants__all`` when some
    participant has work (:func:`participant_work`), a skip saying so otherwise."""

    @schedule(name=SCHEDULE_NAME, cron_schedule=cron, job=job, default_status=status,
              required_resource_keys={PARTICIPANTS_LAKE_KEY},
              description="one pass of every participant when one has work: unacked postings or "
                          "unapplied results in a producer's database, unread postings of a consumer")
    def _schedule(context: ScheduleEvaluationContext):
        lake = getattr(context.resources, PARTICIPANTS_LAKE_KEY).lake()
        work = [w for w in (participant_work(lake, p) for p in configs) if w]
        if not work:
            return SkipReason("no participant has work: every producer's postings are acked and its "
                              "results applied, every consumer has read its postings")
        return RunRequest(tags={"cues/trigger": "schedule", "cues/work": "; ".join(work)[:250]})

    return _schedule


def _dsn(participant: str, dsn: str | None) -> str:
    from cues_platform.participants.db import participant_dsn

    env = secret(f"CUES_PARTICIPANT_DSN_{participant.upper().replace('-', '_')}")  # never logged
    return participant_dsn(participant, dsn=dsn or env, data_dir=current().participants_data)


def consistency_result(participant: str, dsn: str) -> AssetCheckResult:
    """The check's verdict for one participant database."""
    import psycopg

    from cues_platform.participants.checks import check_producer

    with psycopg.connect(dsn) as conn:
        report = check_producer(conn, participant)
    kinds: dict[str, int] = {}
    for issue in report.issues:
        kinds[issue["kind"]] = kinds.get(issue["kind"], 0) + 1
    sample = [f"{i['kind']}: {i['sender']}/{i['message_id']} {i['detail']}" for i in report.issues[:20]]
    return AssetCheckResult(
        passed=not report.issues,
        severity=AssetCheckSeverity.ERROR,
        description=("no consistency issue" if not report.issues
                     else f"{len(report.issues)} consistency issue(s): {kinds}"),
        metadata={"issues": len(report.issues), "by_kind": MetadataValue.json(kinds),
                  "sample": MetadataValue.md("\n".join(f"- {s}" for s in sample) or "-"),
                  "statuses": MetadataValue.json(report.counts)},
    )


class ParticipantPassConfig(Config):
    max_seconds: float = Field(default=300.0, description="stop the pass after this long")
    register_subject: bool = Field(default=True, description="declare the participant's queue subject "
                                                     "first (idempotent; it is in the deployment)")


def build_participant_asset(p: ParticipantConfig, deps: Sequence[AssetKey] = ()):  # noqa: ANN201
    """The asset of one participant (an ``AssetsDefinition``); ``deps``: lineage only."""
    consumer = p.role is Role.CONSUMER
    what = ("processes its POSTINGS subject until drained (exactly-once processor, on Spark)"
            if consumer else "publishes its pending postings and applies its RESULTS")

    @asset(key=asset_key(p.id), group_name=GROUP, deps=list(deps),
           kinds={"postgres", "delta", *({"spark"} if consumer else set())},
           required_resource_keys={PARTICIPANTS_LAKE_KEY, *({SPARK_KEY} if consumer else set())},
           pool=f"cues__participant__{p.id}",
           tags={"cues/participant": p.id, "cues/role": p.role.value},
           metadata={"cues/participant": p.id, "cues/role": p.role.value},
           description=f"Participant {p.id} ({p.role.value}): one bounded pass {what}; "
                       "metadata: its counts by status.")
    def _pass(context: AssetExecutionContext, config: ParticipantPassConfig) -> MaterializeResult:
        from cues_platform.dagster.resources import spark_session_of
        from cues_platform.participants.network import register
        from cues_platform.participants.once import make_instance, pass_instance_id, run_once

        lake = getattr(context.resources, PARTICIPANTS_LAKE_KEY).lake()
        if config.register_subject:
            register(lake, producers=[] if consumer else [p.id], consumers=[p.id] if consumer else [])
        spark = spark_session_of(getattr(context.resources, SPARK_KEY)) if consumer else None
        inst = make_instance(p.id, p.role, lake=lake, dsn=_dsn(p.id, p.dsn), slots=p.slots,
                             instance_id=pass_instance_id(f"dagster-{context.run.run_id[:8]}"),
                             spark=spark)
        report = run_once(inst, max_seconds=config.max_seconds)
        context.log.info(f"participant {p.id} ({p.role.value}) pass: {report.ticks} tick(s) under "
                         f"{report.lease or 'no lease'}, stopped: {report.stopped}; "
                         f"{report.stats}; counts {report.counts}")
        meta: dict[str, object] = dict(report.counts)
        meta.update({f"pass/{k}": v for k, v in report.stats.items()})
        meta.update({"pass/lease": report.lease or "-", "pass/stopped": report.stopped,
                     "pass/ticks": report.ticks, "pass/seconds": round(report.elapsed, 3),
                     "pass/instance": report.instance,
                     "dagster/row_count": report.counts.get("received" if consumer else "messages", 0)})
        if consumer:
            meta["pending"] = report.lag if report.lag is not None else -1
        else:
            meta["pending"] = report.counts["PENDING"]
            meta["acked"] = report.counts["acked_posting"] + report.counts["acked_result"]
        return MaterializeResult(metadata=meta)

    return _pass


def build_consistency_check(p: ParticipantConfig):  # noqa: ANN201 - an AssetChecksDefinition
    @asset_check(asset=asset_key(p.id), name="no_consistency_issues", blocking=False,
                 description=f"fails while participant {p.id} has a consistency issue")
    def _check() -> AssetCheckResult:
        return consistency_result(p.id, _dsn(p.id, p.dsn))

    return _check


def _configs(participants: Mapping[str, str | None] | Sequence[ParticipantConfig] | None
             ) -> list[ParticipantConfig]:
    if participants is None:
        return configured_participants()
    if isinstance(participants, Mapping):  # {id: dsn}: producers (the original form)
        return [ParticipantConfig(pid, Role.PRODUCER, dsn) for pid, dsn in participants.items()]
    return list(participants)


def participant_defs(participants: Mapping[str, str | None] | Sequence[ParticipantConfig] | None = None,
                     *, sensor_interval_seconds: int | None = None,
                     schedule_cron: str | None = "*/5 * * * *",
                     automation: DefaultSensorStatus = DefaultSensorStatus.RUNNING) -> Definitions:
    """Assets, checks, sensors, the job ``participants__all`` and its schedule (no resources:
    the deployment provides ``participants_lake`` and ``spark``). ``automation``: the default
    status of the sensors and the schedule (RUNNING: on as soon as the daemon loads them).
    ``sensor_interval_seconds``: default the setting ``CUES_SENSOR_INTERVAL`` (30 s)."""
    from assets.participants_sensors import build_participant_sensor
    from cues_platform.dagster.definitions import schedule_status

    configs = _configs(participants)
    producers = [asset_key(p.id) for p in configs if p.role is Role.PRODUCER]
    # lineage: postings flow from the producers to the consumers (results flow back: no edge)
    assets_ = [build_participant_asset(p, producers if p.role is Role.CONSUMER else ())
               for p in configs]
    checks = [build_consistency_check(p) for p in configs]
    interval = sensor_interval_seconds if sensor_interval_seconds is not None else current().sensor_interval
    sensors = [build_participant_sensor(p.id, p.role, asset_key(p.id),
                                        lake_key=PARTICIPANTS_LAKE_KEY,
                                        minimum_interval_seconds=interval,
                                        default_status=automation,
                                        job=define_asset_job(participant_job_name(p.id),
                                                             selection=AssetSelection.assets(asset_key(p.id)),
                                                             description=f"one pass of participant {p.id}",
                                                             tags={"cues/group": GROUP, "cues/participant": p.id}))
               for p in configs]
    # one run: producers publish, then consumers process; the next run's producer passes apply
    # the results
    keys = [asset_key(p.id) for p in configs]
    jobs, schedules = [], []
    if keys:
        job = define_asset_job(JOB_NAME, selection=AssetSelection.assets(*keys),
                               description="one pass of every participant", tags={"cues/group": GROUP})
        jobs.append(job)
        if schedule_cron:
            schedules.append(build_participants_schedule(configs, job, schedule_cron,
                                                         schedule_status(automation)))
    return Definitions(assets=assets_, asset_checks=checks, sensors=sensors, jobs=jobs,
                       schedules=schedules)
