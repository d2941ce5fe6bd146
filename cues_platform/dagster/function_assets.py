"""The Dagster asset of a ``@processor_asset`` (``processing/decorators.py``): its body is the
processor function.

Under ``build_definitions`` a processor with ``asset_body=function`` becomes a multi-asset (op
name = processor id, one asset per output queue, or the processor id for a sink) whose inputs are loaded and whose outputs are delivered
by the step IO manager (``step_io.py``), the ``backing`` resource keeping its snapshots and
attempts; under ``cues run`` the same function runs as every other processor's. Both faces write
the same lake: the same queues, hashes, positions and backing records.

The function is called ``fn(ctx, **frames)``: ``ctx`` is the step's
:class:`~cues_platform.processing.StepContext` (``ctx.delivery_hash``, ``ctx.resources``, and
``ctx.host``: Dagster's ``AssetExecutionContext`` in the asset body), every input binding a lazy
Spark DataFrame of the step's range. One materialization is one step of each lane: ``batch_size``
offsets, or a backlog step up to ``max_batch_size`` (``processing/batching.py``).

Lanes: a processor over every partition of a queue (``In(queue)``: one lane per partition,
``processing/lanes.py``) is one multi-asset too. Its materialization opens one step per lane with
work (an idle lane is not started and commits nothing), calls the function once per such lane
(``ctx.processor_id`` and ``ctx.delivery_hash`` are the lane's) and delivers each lane's step
through the lane's own protocol (``step_io.py``): each lane's commits are its own, so a failure
in one lane leaves the lanes delivered before it delivered, and the retry recovers that lane.

Kinds: source, map, join, alts, fork and sink (``@processor_asset``, or a ``Processor`` with
``asset_body=AssetBody.FUNCTION``). A source has no input for the step IO manager to load, so its
body opens the step through that IO manager and calls ``fn(ctx)``. An imperative processor has no
step to split in phases and is refused.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetIn,
    AssetOut,
    Output,
    RetryPolicy,
    multi_asset,
)

from cues_platform.dagster.keys import queue_key
from cues_platform.dagster.materialize import FaultConfig, failure_headline
from cues_platform.dagster.step_io import (
    STEP_BINDING,
    STEP_IO_KEY,
    FunctionTarget,
    StepInput,
    StepOutcome,
)
from cues_platform.processing.decorators import FUNCTION_KINDS, processor_asset
from cues_platform.processing.errors import GraphError
from cues_platform.processing.graph import Graph, Processor


def build_function_asset(graph: Graph, proc: Processor, *, specs: Sequence[Any], prefix: Sequence[str],
                         retry_policy: RetryPolicy | None, pool: str, op_tags: Mapping[str, str],
                         resource_keys: Sequence[str], user_keys: Sequence[str]) -> Any:
    """The multi-asset of a function processor (``specs``: as the runner face's, one per output
    queue or one named after a sink)."""
    if proc.kind not in FUNCTION_KINDS:
        raise GraphError(f"processor {proc.id!r}: a {proc.kind.value} cannot have asset_body=function "
                         "(its function is not called on input ranges)", processor=proc.id)
    ins = {binding: AssetIn(key=queue_key(src.queue, prefix), input_manager_key=STEP_IO_KEY,
                            metadata={STEP_BINDING: binding}, dagster_type=Any)
           for binding, src in proc.inputs.items()}
    outs = {spec.key.to_python_identifier(): AssetOut.from_spec(
                spec.replace_attributes(deps=[]), dagster_type=Any, io_manager_key=STEP_IO_KEY)
            for spec in specs}
    keys = tuple(user_keys)
    target = FunctionTarget(graph, proc, tuple(prefix))
    # a source has no input to load: its body opens the step through the step IO manager
    opener = (STEP_IO_KEY,) if not ins else ()

    def _body(context: AssetExecutionContext, config: FaultConfig, **inputs: StepInput):
        if inputs:
            run = next(iter(inputs.values())).run
        else:
            with failure_headline(proc.id):
                run = getattr(context.resources, STEP_IO_KEY).open_run(target, config)
        resources = {k: getattr(context.resources, k) for k in keys}
        for lane in run.started_lanes:  # the function once per lane with a step, in lane order
            phased = lane.phased
            if phased is None or phased.snapshot is None:
                continue
            ctx = dataclasses.replace(phased.context(), host=context, resources=resources)
            with failure_headline(proc.id):  # a failure's headline is its cause in one line
                phased.call(ctx)
        for out_name in outs:
            yield Output(StepOutcome(run), output_name=out_name)

    # what the step IO manager opens when it loads the op's inputs (step_io.target_of)
    _body.cues_target = target  # type: ignore[attr-defined]
    return multi_asset(name=proc.id, outs=outs, ins=ins, description=proc.doc or None,
                       required_resource_keys={*resource_keys, *keys, *opener}, retry_policy=retry_policy,
                       can_subset=False, pool=pool, op_tags=dict(op_tags))(_body)


__all__ = ["build_function_asset", "processor_asset"]
