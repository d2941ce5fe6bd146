"""Isolation (issue 27): a backlog with a few poison rows against the same backlog without them.

Run: ``.venv/bin/python bench/bench_isolation.py [--rows N] [--poison K] [--rounds R]``
-> ``bench/results/isolation.json`` (``--quick``: 100,000 rows, 2 rounds).

One map processor (exactly_once, default ``Options``: a backlog reads up to 1,000,000 offsets per
step) doubles ``id`` with a Spark expression that raises the user's error (``raise_error``, on
the executors) for the poison ids. The clean contender runs the SAME plan over ids that hold no
poison value. Each round runs both on a fresh lake, the order rotated every round, after one
warm-up of each; reported: medians of the backlog time (``run_until_idle``), the ratio
poisoned / clean, the function calls, rows delivered and rows in the error queue. PASS is
computed here: delivered = N - K and error rows = K exactly (correctness), and the ratio against
the target (<= 1.5x).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
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
)
from cues_platform.queues import Lake  # noqa: E402
from cues_platform.spark import get_spark  # noqa: E402

OUT = Path(__file__).parent / "results" / "isolation.json"
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("note", pa.string())])
TARGET_RATIO = 1.5
CHUNK = 250_000


def poison_ids(rows: int, k: int) -> list[int]:
    """``k`` ids spread evenly through ``[0, rows)``."""
    return [int((i + 0.5) * rows / k) for i in range(k)]


def graph(poison: list[int], calls: list[int]) -> Graph:
    def double(ctx, src):
        calls.append(1)
        bad = F.col("id").isin(poison)
        return src.select(F.when(bad, F.raise_error(F.lit("poison row"))).otherwise(F.col("id") * 2)
                          .cast("long").alias("id"), F.col("note"))

    return Graph.build(name="iso", queues=[QueueDef("a", SCHEMA), QueueDef("b", SCHEMA),
                                           QueueDef("errors", ERROR_SCHEMA)],
                       processors=[Processor("double", Kind.MAP, double, {"src": In("a", "0")},
                                             {"out": Out("b", "0")})],
                       error_queue="errors")


def one_run(spark, rows: int, poison: list[int], values: list[int]) -> dict:
    """A fresh lake holding ``rows`` ids (``values`` says which ids are poison in the plan)."""
    root = Path(tempfile.mkdtemp(prefix="bench-isolation-"))
    try:
        lake = Lake(root=str(root / "lake"))
        calls: list[int] = []
        g = graph(values, calls)
        GraphRunner(graph=g, lake=lake, spark=spark)  # creates the queues
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            lake.queue("a").append(pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                                             "note": ["x"] * n}, schema=SCHEMA), partition="0")
        began = time.perf_counter()
        GraphRunner(graph=g, lake=lake, spark=spark).run_until_idle()
        seconds = time.perf_counter() - began
        return {"seconds": seconds, "calls": len(calls), "delivered": lake.queue("b").count(),
                "error_rows": lake.queue("errors").count(), "poison": len(poison)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--poison", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="100,000 rows, 2 rounds")
    args = parser.parse_args()
    rows, rounds = (100_000, 2) if args.quick else (args.rows, args.rounds)
    poison = poison_ids(rows, args.poison)
    absent = [-1 - p for p in poison]  # the same plan, no id matches
    spark = get_spark()
    contenders = {"clean": lambda: one_run(spark, rows, [], absent),
                  "poisoned": lambda: one_run(spark, rows, poison, poison)}
    for name, run in contenders.items():  # warm up every contender (JIT, Spark's caches)
        print(f"warm-up {name}", flush=True)
        run()
    results: dict[str, list[dict]] = {name: [] for name in contenders}
    order = list(contenders)
    for r in range(rounds):
        for name in order[r % 2:] + order[:r % 2]:  # rotated every round
            got = contenders[name]()
            print(f"round {r} {name}: {got}", flush=True)
            results[name].append(got)
    clean = median([g["seconds"] for g in results["clean"]])
    poisoned = median([g["seconds"] for g in results["poisoned"]])
    last = results["poisoned"][-1]
    exact = all(g["delivered"] == rows - len(poison) and g["error_rows"] == len(poison)
                for g in results["poisoned"])
    ratio = poisoned / clean
    payload = {
        "benchmark": "isolation", "when": now_iso(), "machine": machine_info(),
        "rows": rows, "poison_rows": len(poison), "rounds": rounds,
        "clean_seconds_median": round(clean, 3), "poisoned_seconds_median": round(poisoned, 3),
        "ratio_poisoned_over_clean": round(ratio, 3),
        "function_calls": last["calls"], "delivered": last["delivered"], "error_rows": last["error_rows"],
        "runs": results,
        "targets": {"exact_rows_and_errors": {"pass": exact},
                    "ratio_at_most": {"target": TARGET_RATIO, "measured": round(ratio, 3),
                                      "pass": ratio <= TARGET_RATIO}},
    }
    print(write_json(OUT, payload))
    print(f"clean {clean:.2f} s, poisoned {poisoned:.2f} s: {ratio:.2f}x; calls {last['calls']}, "
          f"delivered {last['delivered']}, error rows {last['error_rows']}; exact: {exact}")


if __name__ == "__main__":
    main()
