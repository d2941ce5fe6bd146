"""The test graph of the Dagster layer (importable: the reconstructable job module uses it).

``orders`` (external, ids 0..n-1) -> enrich (map: id * 2) -> ``enriched`` (pandera.pandas contract:
id >= 0) -> split (fork: ids >= 30 to ``big``, the rest to ``small``;
its step 1 writes both) -> archive (sink: writes
``small`` to the Delta table ``{lake}/sink_effects`` once per step, with the delivery hash).
Batches of 10 rows: 30 orders are 3 steps of enrich and of split, and 2 steps of archive
(15 small rows).
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import functions as F

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
from cues_platform.queues import Lake
from tests.support import PAYLOAD, rows

N, BATCH = 30, 10
BIG = 30  # enriched ids 0..58: step 0 all small, step 1 both, step 2 all big
SINK_TABLE = "sink_effects"


def contract():
    """The contract of ``enriched`` (pandera.pandas: the step checks it row by row)."""
    import pandera.pandas as pap

    return pap.DataFrameSchema({
        "id": pap.Column("int64", pap.Check.ge(0)),
        "note": pap.Column(str, nullable=True),
    })


def enrich(ctx, src):
    """Doubles every order id (the map of the test graph)."""
    return src.select((F.col("id") * 2).alias("id"), F.col("note"))


def split(ctx, src):
    """Routes ids >= 30 to big and the rest to small (the fork of the test graph)."""
    payload = src.select("id", "note")
    return {"big": payload.where(F.col("id") >= BIG), "small": payload.where(F.col("id") < BIG)}


def archive(ctx, src):
    """Archives small ids to the sink_effects Delta table once per step (the sink)."""
    from cues_platform.processing.sinks import write_delta_once

    data = src.select("id", "note").toArrow()
    if data.num_rows:
        write_delta_once(ctx, table_uri=sink_uri(ctx.lake), data=data, hash_column="hash")


def sink_uri(lake: Lake) -> str:
    return lake.root.rstrip("/") + "/" + SINK_TABLE


def build_graph(*, with_contract: bool = True, name: str = "shop") -> Graph:
    queues = [
        QueueDef("orders", PAYLOAD),
        QueueDef("enriched", PAYLOAD, contract=contract() if with_contract else None),
        QueueDef("big", PAYLOAD),
        QueueDef("small", PAYLOAD),
        QueueDef("errors", ERROR_SCHEMA),
    ]
    opts = Options(batch_size=BATCH)
    procs = [
        Processor("enrich", Kind.MAP, enrich, {"src": In("orders")}, {"out": Out("enriched")}, options=opts),
        Processor("split", Kind.FORK, split, {"src": In("enriched")},
                  {"big": Out("big"), "small": Out("small")}, options=opts),
        Processor("archive", Kind.SINK, archive, {"src": In("small")}, options=opts),
    ]
    return Graph.build(name=name, queues=queues, processors=procs, error_queue="errors")


def load_orders(lake: Lake, start: int = 0, count: int = N) -> None:
    from cues_platform.processing.runner import create_queues

    create_queues(build_graph(with_contract=False), lake)
    lake.queue("orders").append(rows(start, count), partition="0")


def ids(lake: Lake, queue: str) -> list[int]:
    q = lake.queue(queue)
    return sorted(i for p in q.partitions for i in q.read_arrow(partition=p)["id"].to_pylist())


def sink_ids(lake: Lake) -> list[int]:
    from deltalake import DeltaTable

    return sorted(DeltaTable(sink_uri(lake)).to_pyarrow_table()["id"].to_pylist())


def expected(n: int = N) -> dict[str, list[int]]:
    doubled = [i * 2 for i in range(n)]
    return {"enriched": doubled, "big": [i for i in doubled if i >= BIG],
            "small": [i for i in doubled if i < BIG], "sink": [i for i in doubled if i < BIG]}


def check_exact(lake: Lake, n: int = N) -> None:
    """Outputs hold exactly the expected ids (each once) and the lake audits clean."""
    from cues_platform.audit import audit

    ex = expected(n)
    for q in ("enriched", "big", "small"):
        assert ids(lake, q) == ex[q], q
    assert sink_ids(lake) == ex["sink"]
    assert lake.queue("errors").count() == 0
    report = audit(lake)
    assert report.ok, report.to_text()


__all__ = ["BATCH", "N", "PAYLOAD", "build_graph", "check_exact", "expected", "ids", "load_orders",
           "pa", "sink_ids"]
