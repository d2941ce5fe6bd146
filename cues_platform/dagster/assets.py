"""Processor assets: one ``multi_asset`` per processor, one asset per output queue.

A materialization runs ``GraphRunner(graph, lake, spark, only=[processor])``, each lane's backing
queue reached through the ``backing`` resource (``resources.BackingQueueResource``): recovery first
(fence older instances, roll forward a prepared attempt, or retry a recorded snapshot), then steps
until the inputs are drained or a bound of :class:`ProcessorRunConfig` is hit. Because recovery
and the step protocol live in the lake (backing queue, app transactions), whatever re-runs the op
— an op retry, a run retry, re-execution from failure, a rerun by hand — continues exactly where
the failed attempt stopped: no input is skipped and no output is written twice.
"""

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetKey,
    AssetSpec,
    MaterializeResult,
    RetryPolicy,
    TableColumn,
    TableColumnConstraints,
    TableConstraints,
    TableSchema,
    multi_asset,
)

from cues_platform.dagster.error_queues import observe_error_queue
from cues_platform.dagster.function_assets import build_function_asset
from cues_platform.dagster.io_manager import QUEUE_METADATA
from cues_platform.dagster.keys import queue_key
from cues_platform.dagster.materialize import (
    InjectedFailure,
    ProcessorRunConfig,
    drive,
    fault_hook,
    merge_lane_metadata,
    pending_delivery,
    queue_metadata,
    run_metadata,
    step_metadata,
)
from cues_platform.dagster.resources import describe_record, spark_session_of
from cues_platform.processing.graph import AssetBody, Graph, Kind, Processor, QueueDef, Strategy
from cues_platform.processing.home import home_of
from cues_platform.processing.idle import LaneWork, lane_work
from cues_platform.processing.runner import GraphRunner, needs_spark

LAKE_KEY = "lake"
SPARK_KEY = "spark"
BACKING_KEY = "backing"
IO_MANAGER_KEY = "cues_io_manager"
KINDS = {"spark", "delta"}
IDLE_STOP = "no new input"  # cues/stopped of a lane that had nothing to do (what the function face says)
__all__ = ["BACKING_KEY", "IO_MANAGER_KEY", "LAKE_KEY", "SPARK_KEY", "InjectedFailure",
           "ProcessorRunConfig", "build_processor_asset", "external_queues", "external_spec",
           "is_audited", "output_queues", "processor_keys", "processor_pool", "queue_key"]


# -- keys and specs ---------------------------------------------------------------------------------
def output_queues(proc: Processor) -> list[str]:
    seen: list[str] = []
    for out in proc.outputs.values():
        if out.queue not in seen:
            seen.append(out.queue)
    return seen


def processor_keys(proc: Processor, prefix: Sequence[str] = ()) -> list[AssetKey]:
    """The asset keys a processor materializes: its output queues, or its own id for a sink."""
    queues = output_queues(proc)
    return [queue_key(q, prefix) for q in queues] if queues else [AssetKey([*prefix, proc.id])]


def external_queues(graph: Graph) -> list[str]:
    """Queues read by some processor and written by none (source assets of the graph)."""
    out: list[str] = []
    for proc in graph.processors.values():
        for src in proc.inputs.values():
            if not graph.producers_of(src.queue) and src.queue not in out:
                out.append(src.queue)
    return out


def column_schema(qdef: QueueDef) -> TableSchema:
    """The queue's columns (payload and metadata), with its contract's checks as constraints: per
    column (``greater_than(0)``, ``isin([...])``) and for the whole row (named checks)."""
    contract = qdef.contract
    schema = contract.to_schema() if isinstance(contract, type) else contract
    checked = dict(getattr(schema, "columns", None) or {})

    def constraints(name: str) -> TableColumnConstraints | None:
        col = checked.get(name)
        if col is None:
            return None
        return TableColumnConstraints(other=[_check_text(c) for c in col.checks])

    table = [_check_text(c) for c in (getattr(schema, "checks", None) or [])]
    return TableSchema(columns=[TableColumn(f.name, str(f.type), constraints=constraints(f.name))
                                for f in qdef.schema],
                       constraints=TableConstraints(other=table) if table else None)


def _check_text(check: Any) -> str:
    return str(check.error or check.name)


def _tag(value: str) -> str:
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in value)[:63]


def processor_pool(graph: Graph, proc: Processor) -> str:
    """The Dagster concurrency pool of a processor's op: ``cues__{graph}__{processor}``. With
    ``concurrency: {pools: {default_limit: 1}}`` in dagster.yaml, two runs never step the same
    processor at once (they would be safe, but the later one fences the earlier)."""
    return f"cues__{_tag(graph.name)}__{_tag(proc.id)}"


def external_spec(graph: Graph, name: str, *, prefix: Sequence[str], group_name: str | None,
                  producers: Sequence[AssetKey] = ()) -> AssetSpec:
    """An external input queue; ``producers``: assets outside the graph that write it (lineage)."""
    qdef = graph.queues[name]
    readers = sorted({p.family or p.id for p in graph.processors.values()
                      if any(i.queue == name for i in p.inputs.values())})
    return AssetSpec(
        queue_key(name, prefix),
        deps=list(producers),
        description=f"External input queue {name!r} of graph {graph.name!r} (written by producers "
                    f"outside the graph; read by {', '.join(readers)}).",
        group_name=group_name,
        kinds={"delta"},
        tags={"cues/role": "external_queue"},
        metadata={QUEUE_METADATA: name, "cues/partitions": list(qdef.partitions),
                  "dagster/column_schema": column_schema(qdef)},
    ).with_io_manager_key(IO_MANAGER_KEY)


def processor_specs(graph: Graph, proc: Processor, *, prefix: Sequence[str],
                    group_name: str | None) -> list[AssetSpec]:
    deps: list[AssetDep] = []
    for src in proc.inputs.values():
        key = queue_key(src.queue, prefix)
        if all(d.asset_key != key for d in deps):
            deps.append(AssetDep(key))
    tags = {"cues/kind": proc.kind.value, "cues/strategy": proc.strategy.value,
            "cues/processor": _tag(proc.id), "cues/graph": _tag(graph.name)}
    doc = proc.doc or f"{proc.kind.value} processor {proc.id!r} of graph {graph.name!r}"
    common = {"cues/processor": proc.id, "cues/kind": proc.kind.value,
              "cues/strategy": proc.strategy.value, "cues/batch_size": proc.options.batch_size,
              "cues/inputs": {b: f"{i.queue}/{i.partition}" for b, i in proc.inputs.items()}}
    err = graph.error_queue_of(proc)
    if err:
        common["cues/error_queue"] = err
    # the graph shows kinds on each node: the processor's name among them (assets are named
    # after their queues, so the processor was visible only in tags)
    kinds = {*KINDS, _tag(proc.id)}
    specs = []
    queues = output_queues(proc)
    if not queues:
        return [AssetSpec(AssetKey([*prefix, proc.id]), deps=deps, description=doc,
                          group_name=group_name, kinds=kinds, tags={**tags, "cues/sink": "true"},
                          metadata=common)]
    for q in queues:
        qdef = graph.queues[q]
        meta = {**common, QUEUE_METADATA: q, "cues/partitions": list(qdef.partitions),
                "dagster/column_schema": column_schema(qdef)}
        if len(queues) > 1:
            desc = f"{doc}\n\nOutput queue {q!r} of {proc.kind.value} processor {proc.id!r}."
        else:
            desc = doc
        specs.append(AssetSpec(queue_key(q, prefix), deps=deps, description=desc,
                               group_name=group_name, kinds=kinds, tags=tags,
                               metadata=meta).with_io_manager_key(IO_MANAGER_KEY))
    return specs


def build_processor_asset(graph: Graph, proc: Processor, *, prefix: Sequence[str] = (),
                          group_name: str | None = None, retry_policy: RetryPolicy | None = None,
                          runner_resource_keys: Sequence[str] = ()) -> Any:
    """The ``multi_asset`` of one processor (op name = processor id): the runner face, or the
    function face of a ``@processor_asset`` (``function_assets.py``)."""
    specs = processor_specs(graph, proc, prefix=prefix, group_name=group_name)
    if proc.asset_body is AssetBody.FUNCTION:
        return build_function_asset(
            graph, proc, specs=specs, prefix=prefix, retry_policy=retry_policy,
            pool=processor_pool(graph, proc), resource_keys=(LAKE_KEY, SPARK_KEY, BACKING_KEY),
            user_keys=runner_resource_keys,
            op_tags={"cues/processor": _tag(proc.id), "cues/kind": proc.kind.value})
    queues = output_queues(proc)
    pid = proc.id
    user_keys = tuple(runner_resource_keys)

    @multi_asset(
        name=pid,
        specs=specs,
        description=proc.doc or None,
        required_resource_keys={LAKE_KEY, SPARK_KEY, BACKING_KEY, *user_keys},
        retry_policy=retry_policy,
        can_subset=False,
        pool=processor_pool(graph, proc),
        op_tags={"cues/processor": _tag(pid), "cues/kind": proc.kind.value},
    )
    def _materialize(context: AssetExecutionContext, config: ProcessorRunConfig):
        lake = getattr(context.resources, LAKE_KEY).lake()
        # a processor whose lanes read Arrow runs without Spark, as under ``cues run``: no JVM
        # started for it (the resource is lazy) and ``ctx.spark`` None
        spark = (spark_session_of(getattr(context.resources, SPARK_KEY)) if needs_spark(graph, [pid])
                 else None)
        resources: Mapping[str, Any] = {k: getattr(context.resources, k) for k in user_keys}
        holder: dict[str, Any] = {}
        hook = fault_hook(config, pid, lambda: holder.get("stepper"))
        started = time.monotonic()
        # the processor's lanes (one per partition of an every-partition binding; itself when
        # it has none), those of partitions added since the graph was built included
        # every lane's backing queue through the ``backing`` resource (as the function face's)
        runner = GraphRunner(graph=graph, lake=lake, spark=spark, only=[pid], hook=hook,
                             resources=resources, backing_of=getattr(context.resources, BACKING_KEY).backing)
        runner.refresh_lanes()
        before = {q: lake.queue(q).end_offsets() for q in queues}
        lanes: dict[str, dict[str, Any]] = {}
        results = []
        for lane_id, stepper in list(runner.steppers.items()):
            holder["stepper"] = stepper
            lane = runner.graph.processors[lane_id]
            last = stepper.backing.last_record() if hasattr(stepper, "backing") else None
            found = describe_record(last)
            rolled = pending_delivery(lake, lane_id, last, home=home_of(lane))
            idle = None if hook is not None else idle_lane(lake, lane)
            if idle is not None:
                # nothing to read and nothing to recover: no recovery, so no fencing commit
                lanes[lane_id] = step_metadata(runner.graph, lane, lake=lake, stepper=idle, results=[],
                                               stopped=_bound_at_start(config) or IDLE_STOP, found=found,
                                               elapsed=time.monotonic() - started)
                continue
            stopped = drive(runner, lane_id, config)
            lanes[lane_id] = run_metadata(runner.graph, lane, runner, stopped, found, rolled,
                                          time.monotonic() - started)
            results += [r for r in runner.stats[lane_id].results if rolled or not r.recovered]
        meta = merge_lane_metadata(runner.graph, lanes)
        context.log.info(
            f"processor {pid}: {meta['cues/steps']} step(s), {meta['cues/rows_in']} row(s) in, "
            f"{meta['cues/rows_out']} out, {meta['cues/rows_to_errors']} to errors, "
            f"{meta['cues/recovered_attempts']} rolled forward; stopped: {meta['cues/stopped']}; "
            f"lag {meta['cues/lag_total']}")
        err = graph.error_queue_of(proc)
        if err and err not in queues:
            context.log_event(observe_error_queue(lake, err, key=queue_key(err, prefix), processor=pid,
                                                  rows_from_run=meta["cues/rows_to_errors"], graph=graph,
                                                  backing_of=getattr(context.resources, BACKING_KEY).backing))
        if not queues:
            yield MaterializeResult(asset_key=specs[0].key, metadata=meta)
            return
        for spec, q in zip(specs, queues, strict=True):
            yield MaterializeResult(asset_key=spec.key, metadata={
                **meta, **queue_metadata(context.instance, spec.key, lake.queue(q),
                                         before=before[q], results=results)})

    return _materialize


@dataclass(frozen=True)
class _IdleLane:
    """What ``step_metadata`` reads of a stepper, for a lane that was not started."""

    positions: dict[str, int]
    pending: None = None


def _bound_at_start(config: ProcessorRunConfig) -> str | None:
    """The bound ``drive`` would stop at before a first step (a zero bound), as it says it."""
    for name, value in (("max_steps", config.max_steps), ("max_rows", config.max_rows),
                        ("max_seconds", config.max_seconds)):
        if value is not None and value <= 0:
            return name
    return None


def idle_lane(lake: Any, lane: Processor) -> _IdleLane | None:
    """The positions of an exactly_once lane with inputs that has no unread rows and nothing to
    recover (``processing/idle.py``), else None: such a lane is not started (its recovery would
    fence: one empty commit in its home queue and one in its backing queue, for nothing)."""
    if lane.strategy is not Strategy.EXACTLY_ONCE or not lane.inputs or lane.kind is Kind.SOURCE:
        return None
    work: LaneWork = lane_work(lake, lane)
    return None if work.has_work else _IdleLane(dict(work.positions))


def is_audited(proc: Processor) -> bool:
    """Exactly-once processors with inputs keep a backing queue the auditor checks."""
    return proc.strategy is Strategy.EXACTLY_ONCE and proc.kind not in (Kind.SOURCE, Kind.IMPERATIVE)
