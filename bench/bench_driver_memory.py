"""Driver memory of one exactly_once step, output written by the driver vs by the executors (issue 11).

Run: ``.venv/bin/python bench/bench_driver_memory.py [--sizes 1000000,10000000]``
-> bench/results/driver_memory.json

For each size N and each ``OutputWriter`` (``driver``: the result collected as Arrow and written
by delta-rs on the driver; ``executors``: Spark writes the files, the driver commits them by
reference), a fresh subprocess runs ONE step of a MAP over an input queue of N rows
(``id``, ``note``; ``batch_size = max_batch_size = N``) on ``local[*]`` and reports the peak
resident memory (``VmHWM`` of ``/proc/<pid>/status``) of the Python driver and of the JVM it
started (in local mode the JVM is Spark's driver and executors at once: the driver path's
collected result lives there too). The input queue is filled by a separate subprocess first, so
loading never counts. The order of the writers is rotated per size.

PASS/FAIL (computed): the executors' Python peak for 10M rows is at most 1.2x its peak for 1M rows
(driver memory does not grow with the step); the driver path's growth is reported for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from common import machine_info, now_iso, write_json  # noqa: E402

CHUNK = 1_000_000


def _hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        for child in map(int, children):
            out += [child, *_descendants(child)]
    return out


def load(root: str, rows: int) -> None:
    """Subprocess: create the graph's queues and fill the input with ``rows`` rows."""
    import numpy as np
    import pyarrow as pa

    from cues_platform.queues import Lake

    lake = Lake(root=root)
    graph = _graph(rows, "driver")
    from cues_platform.processing.runner import create_queues

    # a step of N rows is one batch of the output queue: its row limit must admit it
    lake.create_queue("output", schema=graph.queues["output"].schema, max_batch_rows=max(rows, 1))
    create_queues(graph, lake)
    queue = lake.queue("input")
    for start in range(0, rows, CHUNK):
        n = min(CHUNK, rows - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        queue.append(pa.table({"id": ids, "note": pa.array(ids.astype(str))}), partition="0")


def _graph(rows: int, writer: str):  # noqa: ANN202 - a Graph
    import pyarrow as pa

    from cues_platform.processing import (
        Graph,
        In,
        Kind,
        Options,
        Out,
        OutputWriter,
        Processor,
        QueueDef,
    )

    schema = pa.schema([pa.field("id", pa.int64()), pa.field("note", pa.string())])

    def fn(ctx, src):  # noqa: ANN001, ANN202
        from pyspark.sql import functions as F

        return src.select((F.col("id") * 2).alias("id"), F.col("note"))

    opts = Options(batch_size=rows, max_batch_size=rows, output_writer=OutputWriter(writer))
    return Graph.build(name="memory", queues=[QueueDef("input", schema), QueueDef("output", schema)],
                       processors=[Processor("double", Kind.MAP, fn, {"src": In("input")},
                                             {"out": Out("output")}, options=opts)])


def step(root: str, rows: int, writer: str) -> dict:
    """Subprocess: one step; returns times and peak memory."""
    from cues_platform.processing import GraphRunner
    from cues_platform.queues import Lake
    from cues_platform.spark import get_spark

    spark = get_spark()
    lake = Lake(root=root)
    runner = GraphRunner(graph=_graph(rows, writer), lake=lake, spark=spark, keep_results=False)
    runner.recover()
    t = time.perf_counter()
    stats = runner.run_until_idle()["double"]
    seconds = time.perf_counter() - t
    got = lake.queue("output").count()
    if got != rows or stats.steps != 1:
        raise RuntimeError(f"{writer}: {got} rows in {stats.steps} steps, expected {rows} in 1")
    jvm = max((_hwm_kib(p) for p in _descendants(os.getpid()) if _is_java(p)), default=0)
    return {"writer": writer, "rows": rows, "seconds": round(seconds, 3),
            "python_peak_mib": round(_hwm_kib(os.getpid()) / 1024, 1),
            "jvm_peak_mib": round(jvm / 1024, 1)}


def _is_java(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "java"
    except OSError:
        return False


def _run(*args: str) -> str:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{args[0]} failed:\n{out.stderr[-3000:]}")
    return out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "driver_memory.json")
    parser.add_argument("--note", default="")
    parser.add_argument("--_load", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--_step", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._load:
        load(args._load[0], int(args._load[1]))
        return
    if args._step:
        print(json.dumps(step(args._step[0], int(args._step[1]), args._step[2])))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    started = now_iso()
    results = []
    for i, rows in enumerate(sizes):
        template = Path(tempfile.mkdtemp(prefix="cues-memory-"))
        try:
            _run("--_load", str(template / "lake"), str(rows))
            writers = ["driver", "executors"][i % 2:] + ["driver", "executors"][:i % 2]
            for writer in writers:
                work = template / f"run-{writer}"
                shutil.copytree(template / "lake", work)
                try:
                    result = json.loads(_run("--_step", str(work), str(rows), writer).splitlines()[-1])
                except RuntimeError as exc:  # e.g. the driver path out of memory: a result too
                    lines = [ln for ln in str(exc).splitlines() if "Error" in ln or "error" in ln]
                    result = {"writer": writer, "rows": rows, "failed": (lines or [str(exc)])[-1][:500]}
                print(result, flush=True)
                results.append(result)
                shutil.rmtree(work)
        finally:
            shutil.rmtree(template, ignore_errors=True)

    def peak(writer: str, rows: int, key: str) -> float | None:
        return next((r.get(key) for r in results if r["writer"] == writer and r["rows"] == rows), None)

    small, large = min(sizes), max(sizes)
    growth = {w: {k: (round(peak(w, large, k) / peak(w, small, k), 2)
                      if peak(w, small, k) and peak(w, large, k) else None)
                  for k in ("python_peak_mib", "jvm_peak_mib")} for w in ("driver", "executors")}
    ratio = growth["executors"]["python_peak_mib"]
    target = {"name": f"executors: Python driver peak at {large:,} rows <= 1.2x its peak at {small:,}",
              "value": ratio, "limit": 1.2,
              "status": "PASS" if ratio is not None and ratio <= 1.2 else "FAIL"}
    write_json(args.out, {"benchmark": "driver_memory", "at": started, "machine": machine_info(),
                          "note": args.note, "runs": results, "growth": growth, "target": target})
    print(json.dumps({"growth": growth, "target": target}, indent=2))


if __name__ == "__main__":
    main()
