"""``@processor_asset``: a processor written as a Dagster asset whose body is its function.

    @processor_asset(inputs={"raw": "instructions"}, outputs="parsed", error_queue="errors")
    def parse(ctx, raw):
        return raw.select(...)

gives a :class:`~cues_platform.processing.Processor` (kind from its bindings: one input and one
output a map, several inputs a join, several outputs a fork, no output a sink; ``kind=Kind.ALTS``
to take whichever input has data) that goes into ``Graph.build`` like any other. Under
``build_definitions`` it becomes a multi-asset (op name = processor id, one asset per output
queue, or the processor id for a sink) whose inputs are loaded and whose outputs are delivered
by the step IO manager (``step_io.py``), the ``backing`` resource keeping its snapshots and
attempts; under ``cues run`` the same function runs as every other processor's. Both faces write
the same lake: the same queues, hashes, positions and backing records.

The function is called ``fn(ctx, **frames)``: ``ctx`` is the step's
:class:`~cues_platform.processing.StepContext` (``ctx.delivery_hash``, ``ctx.resources``, and
``ctx.host``: Dagster's ``AssetExecutionContext`` in the asset body), every input binding a lazy
Spark DataFrame of the step's range. One materialization is one step: ``batch_size`` offsets, or a
backlog step up to ``max_batch_size`` (``processing/batching.py``).
"""


import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetIn,
    AssetOut,
    Output,
    RetryPolicy,
    multi_asset,
)

from cues_platform.dagster.materialize import FaultConfig
from cues_platform.dagster.step_io import (
    STEP_BINDING,
    STEP_IO_KEY,
    FunctionTarget,
    StepInput,
    StepOutcome,
)
from cues_platform.processing.errors import GraphError
from cues_platform.processing.graph import AssetBody, Graph, In, Kind, Options, Out, Processor

_FUNCTION_KINDS = (Kind.MAP, Kind.JOIN, Kind.ALTS, Kind.FORK, Kind.SINK)
_RESERVED_INPUTS = {"context", "config"}


def processor_asset(*, inputs: Mapping[str, In | str], outputs: Out | str | Mapping[str, Out | str] | None,
                    kind: Kind | None = None, name: str | None = None, error_queue: str | None = None,
                    options: Options | None = None,
                    description: str = "") -> Callable[[Callable[..., Any]], Processor]:
    """Decorate a processor function into a processor whose Dagster asset body is that function.

    ``inputs``: binding -> queue (partition "0") or :class:`In`. ``outputs``: one queue (binding
    ``out``), an :class:`Out`, a mapping binding -> queue/:class:`Out` (a fork), or None (a sink).
    ``name``: the processor id (default: the function's name)."""

    def decorate(fn: Callable[..., Any]) -> Processor:
        pid = name or getattr(fn, "__name__", "")
        ins = {b: _in(b, v, pid) for b, v in inputs.items()}
        outs = _outs(outputs)
        chosen = kind or _infer_kind(pid, len(ins), len(outs))
        if chosen not in _FUNCTION_KINDS:
            raise GraphError(f"processor {pid!r}: @processor_asset makes a map, join, alts, fork or "
                             f"sink, not a {chosen.value}", processor=pid)
        return Processor(pid, chosen, fn, ins, outs, error_queue=error_queue,
                         options=options or Options(), description=description,
                         asset_body=AssetBody.FUNCTION)

    return decorate


def _in(binding: str, value: In | str, pid: str) -> In:
    if not binding.isidentifier() or binding in _RESERVED_INPUTS or binding.startswith("_"):
        raise GraphError(f"processor {pid!r}: input binding {binding!r} must be a Python identifier "
                         f"(it becomes the Dagster input name), not starting with '_' and not one "
                         f"of {sorted(_RESERVED_INPUTS)}", processor=pid, binding=binding)
    return value if isinstance(value, In) else In(value)


def _outs(outputs: Out | str | Mapping[str, Out | str] | None) -> dict[str, Out]:
    if outputs is None:
        return {}
    if isinstance(outputs, str | Out):
        outputs = {"out": outputs}
    return {b: v if isinstance(v, Out) else Out(v) for b, v in outputs.items()}


def _infer_kind(pid: str, n_in: int, n_out: int) -> Kind:
    if n_out == 0:
        return Kind.SINK
    if n_out > 1:
        return Kind.FORK
    if n_in > 1:
        return Kind.JOIN
    if n_in == 1:
        return Kind.MAP
    raise GraphError(f"processor {pid!r}: @processor_asset needs at least one input", processor=pid)


def build_function_asset(graph: Graph, proc: Processor, *, specs: Sequence[Any], prefix: Sequence[str],
                         retry_policy: RetryPolicy | None, pool: str, op_tags: Mapping[str, str],
                         resource_keys: Sequence[str], user_keys: Sequence[str]) -> Any:
    """The multi-asset of a function processor (``specs``: as the runner face's, one per output
    queue or one named after a sink)."""
    if proc.kind not in _FUNCTION_KINDS:
        raise GraphError(f"processor {proc.id!r}: a {proc.kind.value} cannot have asset_body=function "
                         "(its function is not called on input ranges)", processor=proc.id)
    from cues_platform.dagster.assets import queue_key

    ins = {binding: AssetIn(key=queue_key(src.queue, prefix), input_manager_key=STEP_IO_KEY,
                            metadata={STEP_BINDING: binding}, dagster_type=Any)
           for binding, src in proc.inputs.items()}
    outs = {spec.key.to_python_identifier(): AssetOut.from_spec(
                spec.replace_attributes(deps=[]), dagster_type=Any, io_manager_key=STEP_IO_KEY)
            for spec in specs}
    keys = tuple(user_keys)

    def _body(context: AssetExecutionContext, config: FaultConfig, **frames: StepInput):
        run = next(iter(frames.values())).run
        phased = run.phased
        if phased.snapshot is not None:
            ctx = dataclasses.replace(phased.context(), host=context,
                                      resources={k: getattr(context.resources, k) for k in keys})
            phased.call(ctx)
        for out_name in outs:
            yield Output(StepOutcome(run), output_name=out_name)

    # what the step IO manager opens when it loads the op's inputs (step_io.target_of)
    _body.cues_target = FunctionTarget(graph, proc, tuple(prefix))  # type: ignore[attr-defined]
    return multi_asset(name=proc.id, outs=outs, ins=ins, description=proc.doc or None,
                       required_resource_keys={*resource_keys, *keys}, retry_policy=retry_policy,
                       can_subset=False, pool=pool, op_tags=dict(op_tags))(_body)


__all__ = ["build_function_asset", "processor_asset"]
