"""Driver memory of one exactly_once step, output written by the driver vs by the executors (issue 11).

Run: ``.venv/bin/python bench/bench_driver_memory.py [--sizes 1000000,10000000]``
-> bench/results/driver_memory.json (a smoke run proving the code, numbers meaningless: ``--quick``:
sizes 100,000 and 1,200,000 -> /tmp/driver_memory-quick.json).

For each size N and each contender, a fresh subprocess runs a MAP over an input queue of N rows
(``id``, ``note``) on ``local[*]``. ``driver``, ``executors``, ``auto``: ONE step of N rows
(``batch_size = max_batch_size = N``) with that ``OutputWriter`` (``driver``: the result collected
as Arrow and written by delta-rs on the driver; ``executors``: Spark writes the files, the driver
commits them by reference; ``auto``: the default writer, the driver up to
``AUTO_EXECUTOR_ROWS`` input rows, the executors above). ``defaults``: the backlog of N rows with
default ``Options()`` (default writer and batch sizes: steps of at most ``max_batch_size``,
1,000,000 rows). Each reports the peak
resident memory (``VmHWM`` of ``/proc/<pid>/status``) of the Python driver and of the JVM it
started (in local mode the JVM is Spark's driver and executors at once: the driver path's
collected result lives there too). The input queue is filled by a separate subprocess first, so
loading never counts. The order of the contenders is rotated per size.

PASS/FAIL (computed, under ``targets``; issue 26 reads ``default_writer`` into peers.json): for
``executors``, ``auto`` (id ``default_writer``) and ``defaults``, the Python driver's peak at the
largest size is at most 1.2x its peak at the smallest (driver memory does not grow with the
step / backlog); the driver path's growth is reported for comparison.
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


WRITERS = ("driver", "executors", "auto", "defaults")


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

    opts = (Options() if writer == "defaults"
            else Options(batch_size=rows, max_batch_size=rows, output_writer=OutputWriter(writer)))
    return Graph.build(name="memory", queues=[QueueDef("input", schema), QueueDef("output", schema)],
                       processors=[Processor("double", Kind.MAP, fn, {"src": In("input")},
                                             {"out": Out("output")}, options=opts)])


def step(root: str, rows: int, writer: str) -> dict:
    """Subprocess: one step (``defaults``: the backlog in default steps); times and peak memory."""
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
    if got != rows or (writer != "defaults" and stats.steps != 1):
        raise RuntimeError(f"{writer}: {got} rows in {stats.steps} steps, expected {rows} in 1")
    jvm = max((_hwm_kib(p) for p in _descendants(os.getpid()) if _is_java(p)), default=0)
    return {"writer": writer, "rows": rows, "steps": stats.steps, "seconds": round(seconds, 3),
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
    parser.add_argument("--writers", default=",".join(WRITERS), help=f"subset of {','.join(WRITERS)}")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "driver_memory.json")
    parser.add_argument("--note", default="")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: sizes 100,000 and 1,200,000 -> /tmp/driver_memory-quick.json "
                             "unless --out is given")
    parser.add_argument("--_load", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--_step", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._load:
        load(args._load[0], int(args._load[1]))
        return
    if args._step:
        print(json.dumps(step(args._step[0], int(args._step[1]), args._step[2])))
        return
    if args.quick:
        args.sizes = "100000,1200000"
        if args.out == parser.get_default("out"):
            args.out = Path(tempfile.gettempdir()) / "driver_memory-quick.json"
    sizes = [int(s) for s in args.sizes.split(",")]
    names = [w.strip() for w in args.writers.split(",") if w.strip()]
    unknown = sorted(set(names) - set(WRITERS))
    if unknown:
        parser.error(f"unknown writers {unknown}; choose from {list(WRITERS)}")
    started = now_iso()
    load_start = round(os.getloadavg()[0], 1)
    results = []
    for i, rows in enumerate(sizes):
        template = Path(tempfile.mkdtemp(prefix="cues-memory-"))
        try:
            _run("--_load", str(template / "lake"), str(rows))
            writers = names[i % len(names):] + names[:i % len(names)]
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
                  for k in ("python_peak_mib", "jvm_peak_mib")} for w in names}
    targets = []
    for writer, ident, what in [("executors", "executors", "OutputWriter.EXECUTORS, one step"),
                                ("auto", "default_writer", "the default writer (auto), one step"),
                                ("defaults", "default_options", "default Options, the backlog in default steps")]:
        ratio = growth.get(writer, {}).get("python_peak_mib")
        targets.append({
            "id": ident, "target": f"{what}: Python driver peak at {large:,} rows / at {small:,}",
            "measured": ratio, "op": "<=", "bound": 1.2,
            "result": "NOT MEASURED" if ratio is None else "PASS" if ratio <= 1.2 else "FAIL",
            "detail": f"{writer}: {peak(writer, small, 'python_peak_mib')} MiB at {small:,} rows, "
                      f"{peak(writer, large, 'python_peak_mib')} MiB at {large:,} rows "
                      f"({peak(writer, large, 'steps')} step(s))"})
    write_json(args.out, {"benchmark": "driver_memory", "at": started, "machine": machine_info(),
                          "note": args.note, "quick": args.quick, "sizes": sizes, "writers": names,
                          "load_average_1m": {"start": load_start, "end": round(os.getloadavg()[0], 1)},
                          "runs": results, "growth": growth, "targets": targets})
    print(json.dumps({"growth": growth, "targets": targets}, indent=2))


if __name__ == "__main__":
    main()
