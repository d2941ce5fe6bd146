"""The harness's graph, written the way a user writes one: ``cues run path/to/jepsen_graph.py:graph``.

It is loaded as a file (module ``jepsen_graph``), so :class:`Rejected` is the user's exception
(``jepsen_graph.Rejected``), not the platform's. Topology and keys: :mod:`cues_platform.jepsen.workload`.

Every key queue has two partitions (``workload.PARTITIONS``) and every processor binds
``In(queue)`` (every partition) and ``Out(queue)`` (the lane's partition), so each processor runs
as two lanes (``merge`` and ``merge.1``, ...); both lanes of ``store`` write the one sink table.
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
)


class Rejected(ValueError):
    """The batch holds a key the business rule rejects (the whole batch goes to the error queue)."""


def merge(ctx, a, t):
    """alts: whichever source has data (a retry reads the same one)."""
    return a.select("key", "n").unionByName(t.select("key", "n"))


def validate(ctx, src):
    """map: raise for a batch that holds a rejected key; otherwise pass it on."""
    table = src.select("key", "n").toArrow()
    bad = sorted(k for k in table["key"].to_pylist() if w.is_rejected(k))
    if bad:
        raise Rejected(f"step {ctx.step}: {len(bad)} rejected key(s): {', '.join(bad[:5])}")
    return table


def split(ctx, src):
    """fork: the same rows to both branches."""
    table = src.select("key", "n").toArrow()
    return {"left": table, "right": table}


def enrich(ctx, src):
    """map: a transformed payload, the same keys."""
    return src.select("key", (F.col("n") % 1_000_003).alias("n"))


def store(ctx, src):
    """sink: each step's rows once into a Delta table, keyed by the lane's step (write_delta_once);
    both lanes write the same table, each row naming the lane that applied it."""
    from cues_platform.processing.sinks import write_delta_once

    data = src.select("key", "n", F.lit(ctx.processor_id).alias(w.SINK_LANE_COLUMN)).toArrow()
    write_delta_once(ctx, table_uri=ctx.lake.root.rstrip("/") + "/" + w.SINK_TABLE,
                     data=data, hash_column="hash")


def build(batch_size: int = w.BATCH_SIZE) -> Graph:
    opts = Options(batch_size=batch_size, poll_interval=0.25)
    queues = [QueueDef(name, w.PAYLOAD, partitions=w.PARTITIONS) for name in w.KEY_QUEUES]
    queues.append(QueueDef(w.ERRORS, ERROR_SCHEMA, partitions=(w.PROGRESS_PARTITION,)))
    return Graph.build(
        name="jepsen",
        queues=queues,
        processors=[
            Processor("merge", Kind.ALTS, merge, {"a": In(w.SRC_IDEM), "t": In(w.SRC_TXN)},
                      {"out": Out(w.MERGED)}, options=opts),
            Processor("validate", Kind.MAP, validate, {"src": In(w.MERGED)},
                      {"out": Out(w.VALIDATED)}, options=opts),
            Processor("split", Kind.FORK, split, {"src": In(w.VALIDATED)},
                      {"left": Out(w.LEFT), "right": Out(w.RIGHT)}, options=opts),
            Processor("enrich", Kind.MAP, enrich, {"src": In(w.LEFT)},
                      {"out": Out(w.ENRICHED)}, options=opts),
            Processor("store", Kind.SINK, store, {"src": In(w.RIGHT)}, {}, options=opts),
        ],
        error_queue=w.ERRORS,
    )


graph = build()
