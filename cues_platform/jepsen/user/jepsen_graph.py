"""The harness's graph, written the way a user writes one: ``cues run path/to/jepsen_graph.py:graph``.

It is loaded as a file (module ``jepsen_graph``), so :class:`Rejected` is the user's exception
(``jepsen_graph.Rejected``), not the platform's. Topology and keys: :mod:`cues_platform.jepsen.workload`.

Every key queue has two partitions (``workload.PARTITIONS``) and every processor binds
``In(queue)`` (every partition) and ``Out(queue)`` (the lane's partition), so each processor runs
as two lanes (``merge`` and ``merge.1``, ...); both lanes of ``store`` write the one sink table.

``graph`` is the deployed version; ``graph_<variant>`` (e.g. ``graph_renamed``,
``graph_named_enrich``) is another version of it, as a user would redeploy it: the redeploy
nemesis runs ``cues run jepsen_graph.py:graph_<variant>`` between restarts
(``workload.VARIANTS`` says which must continue and which must be refused). The functions take
their inputs as ``**frames`` so that renamed bindings reach them unchanged.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from cues_platform.jepsen import workload as w
from cues_platform.processing import (
    ERROR_SCHEMA,
    Graph,
    In,
    Kind,
    Options,
    Out,
    Processor,
    QueueDef,
    Strategy,
)
from cues_platform.processing.sinks import write_delta_once


class Rejected(ValueError):
    """The batch holds a key the business rule rejects (the whole batch goes to the error queue)."""


def _one(frames):
    (frame,) = frames.values()
    return frame


def merge(ctx, **frames):
    """alts: whichever source has data (a retry reads the same one; the others' frames are empty)."""
    parts = [f.select("key", "n") for f in frames.values()]
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out


def validate(ctx, **frames):
    """map: raise for a batch that holds a rejected key; otherwise pass it on."""
    table = _one(frames).select("key", "n").toArrow()
    bad = sorted(k for k in table["key"].to_pylist() if w.is_rejected(k))
    if bad:
        raise Rejected(f"step {ctx.step}: {len(bad)} rejected key(s): {', '.join(bad[:5])}")
    return table


def split(ctx, **frames):
    """fork: the same rows to both branches."""
    table = _one(frames).select("key", "n").toArrow()
    return {"left": table, "right": table}


def enrich(ctx, **frames):
    """map: a transformed payload, the same keys."""
    return _one(frames).select("key", (F.col("n") % 1_000_003).alias("n"))


def store(ctx, **frames):
    """sink: each step's rows once into a Delta table, keyed by the lane's step (write_delta_once);
    both lanes write the same table, each row naming the lane that applied it."""
    data = _one(frames).select("key", "n", F.lit(ctx.processor_id).alias(w.SINK_LANE_COLUMN)).toArrow()
    write_delta_once(ctx, table_uri=ctx.lake.root.rstrip("/") + "/" + w.SINK_TABLE,
                     data=data, hash_column="hash")


def build(variant: str = w.BASE, batch_size: int = w.BATCH_SIZE) -> Graph:
    """The graph of ``variant`` (``workload.VARIANTS``)."""
    v = w.VARIANTS[variant]
    opts = Options(batch_size=97 if variant == "batch" else batch_size, poll_interval=0.25)
    bindings = w.bindings_of(variant)
    queues = [QueueDef(name, w.PAYLOAD, partitions=w.PARTITIONS) for name in w.KEY_QUEUES]
    queues.append(QueueDef(w.ERRORS, ERROR_SCHEMA, partitions=(w.PROGRESS_PARTITION,)))
    merge_in = dict(zip(bindings["merge"], [In(w.SRC_IDEM), In(w.SPARE), In(w.SRC_TXN)]
                        if variant == "extra_input" else [In(w.SRC_IDEM), In(w.SRC_TXN)], strict=True))
    if variant == "extra_input":
        queues.append(QueueDef(w.SPARE, w.PAYLOAD, partitions=w.PARTITIONS))
    ins = {"validate": w.MERGED, "split": w.VALIDATED, "enrich": w.LEFT, "store": w.RIGHT}
    outs = {"validate": {"out": w.VALIDATED}, "split": {"left": w.LEFT, "right": w.RIGHT},
            "enrich": {"out": w.ENRICHED}, "store": {}}
    if variant == "home_enrich":
        queues.append(QueueDef(w.ENRICHED_V2, w.PAYLOAD, partitions=w.PARTITIONS))
        outs["enrich"] = {"out": w.ENRICHED_V2}
    kinds = {"validate": Kind.MAP, "split": Kind.FORK, "enrich": Kind.MAP, "store": Kind.SINK}
    fns = {"validate": validate, "split": split, "enrich": enrich, "store": store}
    processors = [Processor("merge", Kind.ALTS, merge, merge_in, {"out": Out(w.MERGED)}, options=opts)]
    for name in ("validate", "split", "enrich", "store"):
        part = None
        options = opts
        pid = name
        if v.target == name:
            if variant.startswith("named_"):
                part = v.needs_partition  # one named partition, under the declared id
            elif variant.startswith("strategy_"):
                options = Options(batch_size=batch_size, poll_interval=0.25, strategy=Strategy.AT_LEAST_ONCE)
            elif variant.startswith("rename_"):
                pid = name + w.RENAMED_SUFFIX
        (src,) = bindings[pid]
        inputs = {src: In(ins[name]) if part is None else In(ins[name], part)}
        outputs = {b: Out(q) if part is None else Out(q, part) for b, q in outs[name].items()}
        processors.append(Processor(pid, kinds[name], fns[name], inputs, outputs, options=options))
    return Graph.build(name=v.graph_name, queues=queues, processors=processors, error_queue=w.ERRORS)


graph = build()


def passthrough(ctx, **frames):
    """map: the same keys (the lane that steps once a platform month, time nemesis)."""
    return _one(frames).select("key", "n")


# The time nemesis's lane that steps once a "month": its runner is resumed (SIGCONT) for one
# burst a platform month and paused (SIGSTOP) in between, so it holds enriched's low-water mark
# a month behind: retention must keep every row it has not read.
monthly = Graph.build(
    name=w.MONTHLY_GRAPH,
    queues=[QueueDef(w.ENRICHED, w.PAYLOAD, partitions=w.PARTITIONS),
            QueueDef(w.MONTHLY_OUT, w.PAYLOAD, partitions=w.PARTITIONS)],
    processors=[Processor(w.MONTHLY, Kind.MAP, passthrough, {"src": In(w.ENRICHED)},
                          {"out": Out(w.MONTHLY_OUT)},
                          options=Options(batch_size=w.MONTHLY_BATCH, max_batch_size=w.MONTHLY_BATCH,
                                          poll_interval=0.25))])


def __getattr__(attr: str) -> Graph:
    """``graph_<variant>``: that version of the graph (built when a runner loads it)."""
    variant = attr.removeprefix("graph_")
    if attr.startswith("graph_") and variant in w.VARIANTS and variant != w.BASE:
        return build(variant)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}; graph variants: "
                         + ", ".join(v.attr for v in w.VARIANTS.values()))
