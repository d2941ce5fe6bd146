"""One run process of ``bench_connect.py``: what a ``cues run`` or a Dagster run process does from
its start to its first step, on the Spark of ``CUES_SPARK_MASTER``.

``python bench/connect_child.py --lake DIR --mode step|materialize --t0 EPOCH`` prints one JSON line:
seconds from ``t0`` (when the parent started this process) to the Spark session being ready and to
the first step being committed, and the rows that step delivered.

- ``step``: ``GraphRunner.run_until_idle`` on the lake (one step: the batch covers the input);
- ``materialize``: the graph's Dagster definitions, ``materialize`` of the processor's asset on
  an ephemeral instance (what a Dagster run process does, minus the run launcher).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pyarrow as pa
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cues_platform.processing import Graph, In, Kind, Options, Out, Processor, QueueDef  # noqa: E402

ORDERS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("amount", pa.float64())])
ROWS = 10_000


def convert(ctx, o):
    return o.select("id", (F.col("amount") * 1.1).alias("amount"))


def graph() -> Graph:
    return Graph.build(
        name="connect_bench",
        queues=[QueueDef("orders", ORDERS), QueueDef("converted", ORDERS)],
        processors=[Processor("convert", Kind.MAP, convert, {"o": In("orders")}, {"out": Out("converted")},
                              options=Options(batch_size=ROWS, max_batch_size=ROWS))])


def prepare(lake_root: str) -> None:
    """The lake every run starts from: ``ROWS`` orders, nothing processed."""
    from cues_platform.processing.runner import create_queues
    from cues_platform.queues import Lake

    lake = Lake(root=lake_root)
    create_queues(graph(), lake)
    lake.queue("orders").append(pa.table({"id": list(range(ROWS)), "amount": [1.0] * ROWS},
                                         schema=ORDERS), partition="0")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lake", required=True)
    parser.add_argument("--mode", choices=["step", "materialize", "prepare"], required=True)
    parser.add_argument("--t0", type=float, default=None)
    args = parser.parse_args()
    if args.mode == "prepare":
        prepare(args.lake)
        return
    t0 = args.t0 or time.time()
    from cues_platform.queues import Lake
    from cues_platform.spark import get_spark

    spark = get_spark()
    ready = time.time() - t0
    if args.mode == "step":
        from cues_platform.processing import GraphRunner

        stats = GraphRunner(graph=graph(), lake=Lake(root=args.lake), spark=spark).run_until_idle()
        rows = stats["convert"].rows_in
    else:
        from dagster import DagsterInstance, materialize

        from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions

        defs = build_definitions(graph(), lake=LakeResource(root=args.lake), spark=CuesSparkResource())
        result = materialize([*(defs.assets or [])], resources=dict(defs.resources or {}),
                             instance=DagsterInstance.ephemeral(), selection=["converted"])
        if not result.success:
            raise SystemExit("the materialization failed")
        rows = Lake(root=args.lake).queue("converted").next_offset("0")
    first_step = time.time() - t0
    from cues_platform.spark.connect import is_connect

    print(json.dumps({"spark_ready_s": round(ready, 3), "first_step_s": round(first_step, 3),
                      "rows": rows, "connect": is_connect(spark)}), flush=True)


if __name__ == "__main__":
    main()
