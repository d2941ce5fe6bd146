"""``@processor_asset``: a processor declared on its function, for the Dagster face whose asset
body is that function (``cues_platform/dagster/function_assets.py``).

    @processor_asset(inputs={"raw": "instructions"}, outputs="parsed", error_queue="errors")
    def parse(ctx, raw):
        return raw.select(...)

gives a :class:`~cues_platform.processing.Processor` (kind from its bindings: one input and one
output a map, several inputs a join, several outputs a fork, no output a sink; ``kind=Kind.ALTS``
to take whichever input has data; ``kind=Kind.SOURCE`` with ``inputs={}`` for a source, called
``fn(ctx)`` with ``ctx.step`` its saved step counter) with ``asset_body=AssetBody.FUNCTION``,
which goes into ``Graph.build`` like any other processor and runs unchanged under ``cues run``.

An input given as a queue name, or as ``In(queue)``, reads every partition of the queue: one lane
per partition (``processing/lanes.py``; one lane for a queue of one partition); its Dagster asset
steps each lane with work once per materialization. ``In(queue, "p")`` reads partition ``p``
only. This module does not import Dagster.

    @processor_asset(inputs={}, outputs="ticks", kind=Kind.SOURCE)
    def tick(ctx):
        return pa.table({"n": [ctx.step]})  # None: nothing to produce now
"""

from collections.abc import Callable, Mapping
from typing import Any

from cues_platform.processing.errors import GraphError
from cues_platform.processing.model import AssetBody, In, Kind, Options, Out, Processor

FUNCTION_KINDS = (Kind.SOURCE, Kind.MAP, Kind.JOIN, Kind.ALTS, Kind.FORK, Kind.SINK)
_RESERVED_INPUTS = {"context", "config"}


def processor_asset(*, inputs: Mapping[str, In | str], outputs: Out | str | Mapping[str, Out | str] | None,
                    kind: Kind | None = None, name: str | None = None, error_queue: str | None = None,
                    options: Options | None = None,
                    description: str = "") -> Callable[[Callable[..., Any]], Processor]:
    """Decorate a processor function into a processor whose Dagster asset body is that function.

    ``inputs``: binding -> queue (every partition: one lane each) or :class:`In` (empty for a
    source). ``outputs``: one queue (binding ``out``), an :class:`Out`, a mapping binding ->
    queue/:class:`Out` (a fork or a source with several outputs), or None (a sink). ``kind``:
    inferred from the bindings; ``Kind.ALTS`` or ``Kind.SOURCE`` must be given. ``name``: the
    processor id (default: the function's name)."""

    def decorate(fn: Callable[..., Any]) -> Processor:
        pid = name or getattr(fn, "__name__", "")
        ins = {b: _in(b, v, pid) for b, v in inputs.items()}
        outs = _outs(outputs)
        chosen = kind or _infer_kind(pid, len(ins), len(outs))
        if chosen not in FUNCTION_KINDS:
            raise GraphError(f"processor {pid!r}: @processor_asset makes a source, map, join, alts, "
                             f"fork or sink, not a {chosen.value}", processor=pid)
        if chosen is Kind.SOURCE and (ins or not outs):
            raise GraphError(f"processor {pid!r}: kind=Kind.SOURCE takes no inputs and at least one "
                             f"output (it has inputs {sorted(ins)} and outputs {sorted(outs)}): a "
                             "processor that reads a queue is not a source; drop kind=Kind.SOURCE or "
                             "the inputs", processor=pid)
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
    raise GraphError(f"processor {pid!r}: @processor_asset needs at least one input, or "
                     "kind=Kind.SOURCE for a source (fn(ctx) produces rows from outside)", processor=pid)


__all__ = ["FUNCTION_KINDS", "processor_asset"]
