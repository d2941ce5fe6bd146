"""The Dagster face of replay: a job that feeds chosen error rows back to their processor.

``build_replay_job(graph)`` makes the job ``{graph}__replay_errors`` (one op,
``{graph}__replay``) whose run config names the processor (as declared: the family of its
lanes), an optional Spark SQL ``where`` over the error queue's columns (``processor``, ``step``,
``inputs``, ``exception_type``, ``message``, ``payload``, ``failed_at``, ``_offset``) and
``dry_run``. It runs :func:`cues_platform.processing.replay.replay_errors` -- what ``cues errors
replay`` runs -- with the deployment's resources: the lake (``lake``), Spark (``spark``), every
lane's backing queue through the ``backing`` resource, and the graph's user resources (handed to
the processor's function as ``ctx.resources``, as in a materialization).

Exactly once, whatever re-runs it: a replayed error row is in its lane's replay log (the replay
step's attempt record in the backing queue), so running the job again, re-executing a failed run
or two runs at once never deliver a row twice (the later run fences the earlier one's lane: the
earlier fails with ``ProcessorFencedError`` and delivered nothing of its current step). A run of
the job also fences a materialization of the processor running at the same time, which then fails
and is recovered by its next run. The op's output metadata is the ``ReplayReport``; the run fails
(``dagster.Failure``, the report's summary as its description) when some chosen rows could not be
read again (their input was removed by retention, or the lane reads other partitions since a
redeploy): the other rows were replayed. After the replay the op logs an observation of the error
queue asset (``error_queues.observe_error_queue``) with its pending and replayed rows.

The job's name is per graph (``{graph}__replay_errors``): one code location holds several graphs.
"""


from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    Config,
    Failure,
    JobDefinition,
    MetadataValue,
    Nothing,
    OpExecutionContext,
    Out,
    Output,
    job,
    op,
)
from pydantic import Field

from cues_platform.dagster.assets import BACKING_KEY, LAKE_KEY, SPARK_KEY
from cues_platform.dagster.error_queues import observe_error_queue
from cues_platform.dagster.keys import queue_key
from cues_platform.dagster.resources import spark_session_of
from cues_platform.processing.graph import Graph
from cues_platform.processing.replay import ReplayReport, replay_errors

REPLAY_TAG = "cues/replay"


def _name(value: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in value)


def replay_job_name(graph: Graph) -> str:
    return f"{_name(graph.name)}__replay_errors"


def replay_op_name(graph: Graph) -> str:
    """The op's name (op names are unique in a code location); the run config goes under it:
    ``ops: {<graph>__replay: {config: {processor: ..., where: ..., dry_run: ...}}}``."""
    return f"{_name(graph.name)}__replay"


class ReplayConfig(Config):
    """Run config of the replay op."""

    processor: str = Field(description="the processor (as declared) whose error rows are replayed")
    where: str | None = Field(
        default=None,
        description="only the error rows matching this Spark SQL condition over the error "
                    "queue's columns (processor, step, inputs, exception_type, message, payload, "
                    "failed_at, _offset), e.g. \"exception_type LIKE '%KeyError'\"")
    dry_run: bool = Field(default=False, description="count what would be replayed; deliver nothing")


def report_metadata(report: ReplayReport) -> dict[str, Any]:
    """The report as op output metadata."""
    meta: dict[str, Any] = {
        "cues/processor": report.processor,
        "cues/error_queue": report.error_queue,
        "cues/dry_run": report.dry_run,
        "cues/selected": report.selected,
        "cues/pending": report.pending,
        "cues/replayed": report.replayed,
        "cues/failed_again": report.failed_again,
        "cues/already_replayed": report.already_replayed,
        "cues/refused_contract": report.refused_contract,
        "cues/unavailable": len(report.unavailable),
        "cues/summary": report.summary(),
    }
    if report.unavailable:
        meta["cues/unavailable_rows"] = MetadataValue.json(report.unavailable)
    if report.steps:
        meta["cues/replay_steps"] = MetadataValue.json(
            [{"step": s.step, "delivery_hash": s.delivery_hash, "outcome": s.outcome,
              "rows_out": dict(s.rows_out)} for s in report.steps])
    return meta


def build_replay_op(graph: Graph, *, prefix: Sequence[str] = (),
                    runner_resource_keys: Sequence[str] = ()) -> Any:
    user_keys = tuple(runner_resource_keys)
    families = graph.family_order()

    @op(name=replay_op_name(graph), required_resource_keys={LAKE_KEY, SPARK_KEY, BACKING_KEY, *user_keys},
        out=Out(Nothing), tags={REPLAY_TAG: _name(graph.name)},
        description=f"replay the error rows of a processor of graph {graph.name!r} (one of "
                    f"{', '.join(families)}) exactly once, after its function or data was fixed "
                    "(as `cues errors replay`)")
    def _replay(context: OpExecutionContext, config: ReplayConfig) -> Output:
        lake = getattr(context.resources, LAKE_KEY).lake()
        spark = spark_session_of(getattr(context.resources, SPARK_KEY))
        backing_of = getattr(context.resources, BACKING_KEY).backing
        resources: Mapping[str, Any] = {k: getattr(context.resources, k) for k in user_keys}

        def progress(done: int, todo: int) -> None:
            context.log.info(f"{config.processor}: {done} of {todo} chosen error row(s) done")

        report = replay_errors(graph=graph, processor=config.processor, lake=lake, spark=spark,
                               where=config.where, resources=resources, backing_of=backing_of,
                               dry_run=config.dry_run, progress=progress)
        context.log.info(report.summary())
        meta = report_metadata(report)
        if lake.has_queue(report.error_queue):
            context.log_event(observe_error_queue(
                lake, report.error_queue, key=queue_key(report.error_queue, prefix),
                processor=config.processor, rows_from_run=sum(
                    s.rows_out.get(report.error_queue, 0) for s in report.steps),
                graph=graph, backing_of=backing_of))
        if report.unavailable:
            raise Failure(
                description=(f"{report.summary()}. The other rows were replayed (running the job "
                             "again replays nothing twice). The unavailable rows' inputs cannot be "
                             "read again: re-feed them by hand, or replay them with the graph that "
                             "failed on them"),
                metadata=meta, allow_retries=False)
        return Output(None, metadata=meta)

    return _replay


def build_replay_job(graph: Graph, *, prefix: Sequence[str] = (),
                     runner_resource_keys: Sequence[str] = ()) -> JobDefinition | None:
    """The job ``{graph}__replay_errors``, or None for a graph without an error queue (nothing to
    replay). ``runner_resource_keys``: the graph's user resources (``build_definitions``' extra
    resource keys), handed to the processor's function."""
    if not graph.error_queue and not any(p.error_queue for p in graph.processors.values()):
        return None
    replay = build_replay_op(graph, prefix=prefix, runner_resource_keys=runner_resource_keys)

    @job(name=replay_job_name(graph), tags={"cues/graph": _name(graph.name), REPLAY_TAG: "true"},
         description=f"replay chosen error rows of a processor of graph {graph.name!r} exactly once "
                     "(run config: processor, where, dry_run)")
    def _job() -> None:
        replay()

    return _job


__all__ = ["REPLAY_TAG", "ReplayConfig", "build_replay_job", "build_replay_op", "replay_job_name",
           "replay_op_name", "report_metadata"]
