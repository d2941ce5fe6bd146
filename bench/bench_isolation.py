"""Isolation (issue 27): a backlog with a few poison rows against the same backlog without them.

Run: ``.venv/bin/python bench/bench_isolation.py [--rows N] [--poison K] [--rounds R]
[--modes sequential,concurrent,...]`` -> ``bench/results/isolation.json`` (``--quick``: 100,000
rows, 2 rounds).

One map processor (exactly_once, default ``Options``: a backlog reads up to 1,000,000 offsets per
step) doubles ``id`` with a Spark expression that raises the user's error (``raise_error``, on
the executors) for the poison ids. The clean contender runs the SAME plan over ids that hold no
poison value. The poisoned backlog runs once per isolation mode (``MODES``: how many calls of
one level of the search run at once, ``workers``, and how many pieces the step is first split
into, ``first_split``; ``sequential`` is the search as it was before: one call after another,
halves). Each round runs every contender on a fresh lake, the order rotated every round, after
one warm-up of each; reported: medians of the backlog time (``run_until_idle``), the ratio
poisoned / clean per mode, the function calls, rows delivered and rows in the error queue, the
load average of the (shared) machine before and after every run, and, from the sequential mode,
the time between the starts of consecutive calls (a call's whole cost: the function's plan,
the Spark job, its Arrow result) for calls on at most 1,000 offsets. Every round also times
calls on ONE offset directly (``floor_run``: one after another and 4 at a time; as step.py makes
them, and over only the data files holding the offset), and the JSON gives the information
bound: a call says only "failed or not", so finding K rows among N takes at least
log2 C(N, K) calls, whatever the search. PASS is
computed here, for the best mode: delivered = N - K and error rows = K exactly in every mode
(correctness), and the ratio against the target (<= 1.5x).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, median, now_iso, write_json  # noqa: E402

from cues_platform.processing import (  # noqa: E402
    ERROR_SCHEMA,
    Graph,
    GraphRunner,
    In,
    Kind,
    Out,
    Processor,
    QueueDef,
    isolation,  # noqa: E402
)
from cues_platform.queues import Lake  # noqa: E402
from cues_platform.queues.reader import execute_spark, plan_read  # noqa: E402
from cues_platform.queues.schema import OFFSET  # noqa: E402
from cues_platform.spark import get_spark  # noqa: E402

OUT = Path(__file__).parent / "results" / "isolation.json"
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("note", pa.string())])
TARGET_RATIO = 1.5
CHUNK = 250_000
SMALL = 1_000  # a call on at most this many offsets: its time is the per-call floor
MODES = {  # name -> (workers, first_split): isolation.isolate's options
    "sequential": (1, 2),  # the search as before: one call after another, halves
    "concurrent": (4, 2),  # every call of a level of halves, 4 at a time
    "wide": (4, 16),  # the step first split in 16, then halves, 4 at a time
}


def poison_ids(rows: int, k: int) -> list[int]:
    """``k`` ids spread evenly through ``[0, rows)``."""
    return [int((i + 0.5) * rows / k) for i in range(k)]


def graph(poison: list[int], calls: list[tuple[float, int]]) -> Graph:
    def double(ctx, src):
        r = ctx.inputs["src"]
        calls.append((time.perf_counter(), r.end - r.start))  # list.append: safe from threads
        bad = F.col("id").isin(poison)
        return src.select(F.when(bad, F.raise_error(F.lit("poison row"))).otherwise(F.col("id") * 2)
                          .cast("long").alias("id"), F.col("note"))

    return Graph.build(name="iso", queues=[QueueDef("a", SCHEMA), QueueDef("b", SCHEMA),
                                           QueueDef("errors", ERROR_SCHEMA)],
                       processors=[Processor("double", Kind.MAP, double, {"src": In("a", "0")},
                                             {"out": Out("b", "0")})],
                       error_queue="errors")


def one_run(spark, rows: int, poison: list[int], values: list[int], mode: str = "sequential") -> dict:
    """A fresh lake holding ``rows`` ids (``values`` says which ids are poison in the plan),
    isolating in ``mode``."""
    root = Path(tempfile.mkdtemp(prefix="bench-isolation-"))
    saved = isolation.WORKERS, isolation.FIRST_SPLIT
    isolation.WORKERS, isolation.FIRST_SPLIT = MODES[mode]  # what isolate() takes by default
    load_before = os.getloadavg()[0]
    try:
        lake = Lake(root=str(root / "lake"))
        calls: list[tuple[float, int]] = []
        g = graph(values, calls)
        GraphRunner(graph=g, lake=lake, spark=spark)  # creates the queues
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            lake.queue("a").append(pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                                             "note": ["x"] * n}, schema=SCHEMA), partition="0")
        began = time.perf_counter()
        GraphRunner(graph=g, lake=lake, spark=spark).run_until_idle()
        seconds = time.perf_counter() - began
        # sequential calls: a call's cost is the time from its start to the next one's start
        small = ([b[0] - a[0] for a, b in zip(calls, calls[1:], strict=False) if a[1] <= SMALL]
                 if MODES[mode][0] == 1 and poison else [])
        return {"seconds": seconds, "calls": len(calls), "delivered": lake.queue("b").count(),
                "error_rows": lake.queue("errors").count(), "poison": len(poison),
                "small_call_seconds_median": round(median(small), 4) if small else None,
                "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    finally:
        isolation.WORKERS, isolation.FIRST_SPLIT = saved
        shutil.rmtree(root, ignore_errors=True)


def floor_run(spark, rows: int, probes: int = 40) -> dict:
    """The cost of one isolation call on ONE offset, made as step.py makes it (the step's whole
    input frame filtered to the offset, the bench's function, ``toArrow``), one after another and
    4 at a time from threads; and, for comparison, with the frame planned over only the data
    files holding the offset (``narrowed``: what step.py could do, not what it does). Seconds per
    call, ``probes`` calls on offsets spread through the backlog."""
    root = Path(tempfile.mkdtemp(prefix="bench-isolation-floor-"))
    try:
        lake = Lake(root=str(root / "lake"))
        GraphRunner(graph=graph([], []), lake=lake, spark=spark)
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            lake.queue("a").append(pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                                             "note": ["x"] * n}, schema=SCHEMA), partition="0")
        queue = lake.queue("a")
        plan = plan_read(queue, partition="0", start=0, end=rows)
        whole = execute_spark(queue, spark, plan)
        absent = F.col("id").isin([-1, -2])

        def fn(src):  # the bench's function, with no poison value
            return src.select(F.when(absent, F.raise_error(F.lit("poison row"))).otherwise(F.col("id") * 2)
                              .cast("long").alias("id"), F.col("note"))

        def filtered(o: int) -> int:
            return fn(whole.where(f"{OFFSET} >= {o} AND {OFFSET} < {o + 1}")).toArrow().num_rows

        def narrowed(o: int) -> int:
            files = tuple(f for f in plan.files if f.min_offset <= o <= f.max_offset)
            return fn(execute_spark(queue, spark, dataclasses.replace(plan, start=o, end=o + 1, files=files))
                      ).toArrow().num_rows

        offsets = [(i * 7919 * 127) % rows for i in range(probes)]
        got: dict[str, float] = {"data_files": len(plan.files)}
        for name, one in (("filtered", filtered), ("narrowed", narrowed)):
            began = time.perf_counter()
            assert all(one(o) == 1 for o in offsets)
            got[f"{name}_sequential"] = round((time.perf_counter() - began) / probes, 4)
            began = time.perf_counter()
            with ThreadPoolExecutor(max_workers=4) as pool:
                assert all(n == 1 for n in pool.map(one, offsets))
            got[f"{name}_4_threads"] = round((time.perf_counter() - began) / probes, 4)
        return got
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--poison", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument("--quick", action="store_true", help="100,000 rows, 2 rounds")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows, rounds = (100_000, 2) if args.quick else (args.rows, args.rounds)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose among {sorted(MODES)}")
    poison = poison_ids(rows, args.poison)
    absent = [-1 - p for p in poison]  # the same plan, no id matches
    spark = get_spark()
    contenders = {"clean": lambda: one_run(spark, rows, [], absent)}
    for mode in modes:
        contenders[mode] = lambda mode=mode: one_run(spark, rows, poison, poison, mode)
    for name, run in contenders.items():  # warm up every contender (JIT, Spark's caches)
        print(f"warm-up {name}", flush=True)
        run()
    floor_run(spark, rows)  # warm-up
    floors: list[dict] = []
    results: dict[str, list[dict]] = {name: [] for name in contenders}
    order = list(contenders)
    for r in range(rounds):
        shift = r % len(order)
        for name in order[shift:] + order[:shift]:  # rotated every round
            got = contenders[name]()
            print(f"round {r} {name}: {got}", flush=True)
            results[name].append(got)
        floors.append(floor_run(spark, rows))
        print(f"round {r} floor: {floors[-1]}", flush=True)
    clean = median([g["seconds"] for g in results["clean"]])
    exact = all(g["delivered"] == rows - len(poison) and g["error_rows"] == len(poison)
                for m in modes for g in results[m])
    per_mode = {}
    for mode in modes:
        seconds = median([g["seconds"] for g in results[mode]])
        last = results[mode][-1]
        small = [g["small_call_seconds_median"] for g in results[mode] if g["small_call_seconds_median"]]
        per_mode[mode] = {
            "workers": MODES[mode][0], "first_split": MODES[mode][1],
            "poisoned_seconds_median": round(seconds, 3), "ratio_poisoned_over_clean": round(seconds / clean, 3),
            "function_calls": last["calls"], "delivered": last["delivered"], "error_rows": last["error_rows"],
            "isolation_seconds_per_call": round((seconds - clean) / max(1, last["calls"] - 1), 4),
            **({"small_call_seconds_median": round(median(small), 4)} if MODES[mode][0] == 1 and small else {}),
        }
    best = min(modes, key=lambda m: per_mode[m]["poisoned_seconds_median"])
    ratio = per_mode[best]["ratio_poisoned_over_clean"]
    loads = [x for runs in results.values() for g in runs for x in g["load_average_1m"]]
    payload = {
        "benchmark": "isolation", "when": now_iso(), "machine": machine_info(),
        "shared_machine": {"note": "2 cores shared with other engineers' work while this ran",
                           "load_average_1m_min": min(loads), "load_average_1m_max": max(loads),
                           "load_average_1m_median": round(median(loads), 2)},
        "rows": rows, "poison_rows": len(poison), "rounds": rounds,
        "clean_seconds_median": round(clean, 3), "modes": per_mode, "best_mode": best,
        "one_offset_call_seconds_median": {k: round(median([f[k] for f in floors]), 4) for k in floors[0]},
        "information_bound_calls": round(math.log2(math.comb(rows, len(poison))), 1),
        "runs": results, "floor_runs": floors,
        "targets": {"exact_rows_and_errors": {"pass": exact},
                    "ratio_at_most": {"target": TARGET_RATIO, "mode": best, "measured": ratio,
                                      "pass": ratio <= TARGET_RATIO}},
    }
    print(write_json(args.out, payload))
    for mode, got in per_mode.items():
        print(f"{mode}: {got}")
    print(f"clean {clean:.2f} s; best {best}: {ratio:.2f}x; exact: {exact}; load {min(loads)}..{max(loads)}")


if __name__ == "__main__":
    main()
