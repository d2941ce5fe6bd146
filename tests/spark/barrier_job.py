"""A driver for the worker-kill test, run as ``python tests/spark/barrier_job.py LAKE BARRIER``
with ``CUES_SPARK_MASTER`` set to the cluster.

Loads ``N`` rows into queue ``a`` and runs a map processor ``a -> b`` whose Spark function passes
every Spark partition through a gate on the executors: the Python worker writes
``BARRIER/arrived-<pid>-<n>`` (holding its executor's folder) and waits until ``BARRIER/release`` exists, so the test knows which
worker runs the step's task *while* it runs, kills that worker, then releases the gate. The
output is written by the executors (``OutputWriter.EXECUTORS``). Prints one JSON line: the steps.
"""

from __future__ import annotations

import json
import sys

import pyarrow as pa

from cues_platform.processing import (
    Graph,
    GraphRunner,
    In,
    Kind,
    Options,
    Out,
    OutputWriter,
    Processor,
    QueueDef,
)
from cues_platform.queues import Lake
from cues_platform.spark import get_spark

N, BATCH = 60, 30
PAYLOAD = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("note", pa.string())])


def gated(barrier: str):
    def gate(batches):  # runs in a Python worker of an executor
        import itertools
        import os
        import pathlib
        import time

        folder = pathlib.Path(barrier)
        for n in itertools.count():
            marker = folder / f"arrived-{os.getpid()}-{n}"
            if not marker.exists():
                marker.write_text(os.getcwd())  # the executor's folder: work/<worker>/<app>/<n>
                break
        while not (folder / "release").exists():
            time.sleep(0.05)  # the barrier: held until the test has killed a worker
        yield from batches

    return gate


def build(barrier: str) -> Graph:
    def through_gate(ctx, src):
        return src.select("id", "note").mapInPandas(gated(barrier), schema="id long, note string")

    opts = Options(batch_size=BATCH, max_batch_size=BATCH, output_writer=OutputWriter.EXECUTORS)
    return Graph.build(
        name="barrier",
        queues=[QueueDef("a", PAYLOAD, partitions=("0",)), QueueDef("b", PAYLOAD, partitions=("0",))],
        processors=[Processor("p", Kind.MAP, through_gate, {"src": In("a")}, {"out": Out("b")},
                              options=opts)],
    )


def main(lake_root: str, barrier: str) -> None:
    lake = Lake(root=lake_root)
    graph = build(barrier)
    runner = GraphRunner(graph=graph, lake=lake, spark=get_spark())
    data = pa.table({"id": pa.array(range(N), pa.int64()), "note": [f"n{i}" for i in range(N)]},
                    schema=PAYLOAD)
    lake.queue("a").producer(producer_id="loader").send(data, partition="0", sequence=0)
    stats = runner.run_until_idle()["p"]
    print(json.dumps({"steps": len(stats.results),
                      "hashes": [r.delivery_hash for r in stats.results]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
