"""Lanes (issue 14 item 1): does stepping a processor's lanes concurrently pay on this machine?

Run: ``.venv/bin/python bench/bench_lanes.py [--quick]`` -> bench/results/lanes.json

One map over every partition of ``orders`` (``In("orders")``: one lane per partition), with 2 and
4 partitions of ``rows`` rows each, steps of ``batch`` offsets. Two contenders on the same Spark
session, each warmed up once, the order rotated every round, medians over the rounds:

- ``sequential``: ``GraphRunner.run_until_idle`` with ``Options(lane_workers=1)``: one lane's
  step at a time, in turn (what the Dagster asset does, lane after lane);
- ``concurrent``: the same with ``lane_workers`` = the number of lanes (the default 4 covers
  both sizes): each pass steps every lane at once in threads, Spark runs their jobs side by side
  and each lane commits its own partition (what ``cues run`` does).

Every round runs on a fresh lake and checks that each partition's output holds every input row
once; a contender that fails the check or raises is reported, not timed. The verdict
(``concurrent_pays``: its median throughput >= 1.1x sequential's) is computed here.
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

from cues_platform.processing import Graph, GraphRunner, In, Kind, Options, Out, Processor, QueueDef  # noqa: E402
from cues_platform.processing.runner import create_queues  # noqa: E402
from cues_platform.queues import Lake  # noqa: E402
from cues_platform.spark import get_spark  # noqa: E402

ORDERS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("amount", pa.float64())])
OUT = Path(__file__).resolve().parent / "results" / "lanes.json"
PAYS = 1.1


def convert(ctx, o):
    return o.select("id", (F.col("amount") * 1.1).alias("amount"))


def graph(partitions: int, batch: int, workers: int) -> Graph:
    parts = tuple(str(p) for p in range(partitions))
    return Graph.build(
        name="lanes",
        queues=[QueueDef("orders", ORDERS, parts), QueueDef("converted", ORDERS, parts)],
        processors=[Processor("convert", Kind.MAP, convert, {"o": In("orders")}, {"out": Out("converted")},
                              options=Options(batch_size=batch, max_batch_size=batch, lane_workers=workers))])


def load(lake: Lake, g: Graph, rows: int) -> None:
    create_queues(g, lake)
    orders = lake.queue("orders")
    for p in g.queues["orders"].partitions:
        base = int(p) * rows
        orders.append(pa.table({"id": pa.array(range(base, base + rows), pa.int64()),
                                "amount": pa.array([1.0] * rows, pa.float64())}, schema=ORDERS), partition=p)


CONTENDERS = ("sequential", "concurrent")


def one(spark, tmp: Path, name: str, partitions: int, rows: int, batch: int) -> float:
    """Seconds for ``name`` to drain a fresh lake; raises AssertionError on a wrong result."""
    root = tmp / f"lake-{name}-{time.monotonic_ns()}"
    lake = Lake(root=str(root))
    g = graph(partitions, batch, 1 if name == "sequential" else partitions)
    load(lake, g, rows)
    runner = GraphRunner(graph=g, lake=lake, spark=spark, keep_results=False)
    started = time.perf_counter()
    runner.run_until_idle()
    seconds = time.perf_counter() - started
    out = lake.queue("converted")
    for p in g.queues["orders"].partitions:
        ids = sorted(out.read_arrow(partition=p)["id"].to_pylist())
        assert ids == list(range(int(p) * rows, int(p) * rows + rows)), f"{name}: partition {p} is not exact"
    shutil.rmtree(root, ignore_errors=True)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 rounds (a smoke run)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows, batch, rounds = (2_000, 500, 2) if args.quick else (20_000, 2_000, 5)
    spark = get_spark()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="cues-bench-lanes-") as folder:
        tmp = Path(folder)
        for partitions in (2, 4):
            times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
            failures: dict[str, str] = {}
            for name in CONTENDERS:  # warm-up, not timed
                try:
                    one(spark, tmp, name, partitions, rows // 4, batch)
                except Exception as exc:  # noqa: BLE001 - reported, the contender is not timed
                    failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            names = [n for n in CONTENDERS if n not in failures]
            ratios = []
            for r in range(rounds):
                order = names[r % len(names):] + names[:r % len(names)] if names else []
                this: dict[str, float] = {}
                for name in order:
                    try:
                        this[name] = one(spark, tmp, name, partitions, rows, batch)
                    except Exception as exc:  # noqa: BLE001
                        failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                for name, s in this.items():
                    times[name].append(s)
                if len(this) == 2:
                    ratios.append(this["sequential"] / this["concurrent"])
                print(f"{partitions} partitions, round {r}: " +
                      ", ".join(f"{n} {s:.2f} s" for n, s in this.items()), flush=True)
            total = partitions * rows
            entry = {"rows": total, "batch": batch, "steps_per_lane": -(-rows // batch),
                     "failures": failures,
                     "median_seconds": {n: median(v) for n, v in times.items() if v},
                     "rows_per_second": {n: total / median(v) for n, v in times.items() if v},
                     "concurrent_vs_sequential_per_round": ratios}
            entry["concurrent_vs_sequential"] = median(ratios) if ratios else None
            entry["concurrent_pays"] = bool(ratios) and median(ratios) >= PAYS
            results[f"{partitions}_partitions"] = entry
            print(f"{partitions} partitions: concurrent/sequential throughput "
                  f"{entry['concurrent_vs_sequential']}, pays (>= {PAYS}x): {entry['concurrent_pays']}",
                  flush=True)
    write_json(args.out, {"benchmark": "lanes", "mode": "quick" if args.quick else "full",
                          "finished_at": now_iso(), "machine": machine_info(), "rounds": rounds,
                          "pays_threshold": PAYS, "results": results})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
