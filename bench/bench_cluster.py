"""Cluster benchmark (issue 13): the issue-9/11 workload on a standalone Spark cluster of 1 worker
vs 2 workers, on this machine.

Run: ``.venv/bin/python bench/bench_cluster.py [--rows 200000] [--rounds 3]`` -> bench/results/cluster.json
(``--quick``: 50,000 rows, 1 round, to /tmp/cluster-quick.json).

Both clusters run at once (``cues_platform.spark.cluster.start_cluster``, 127.0.0.1, random
ports): ``one_worker`` (1 worker, 1 core) and ``two_workers`` (2 workers, 1 core each; an
application gets one core on each). The workload is bench_peers.py's: ``--rows`` generated postings
in 10 chunks, priced by one exactly_once MAP processor (fx broadcast join + status rules), 10
steps, the output written by the executors (``OutputWriter.EXECUTORS``, issue 9) and committed by
reference. Each run attaches this process's Spark session to the contender's master (a new
application; untimed: the session starts, its executors register, a tiny job runs), then times
recovery + the 10 steps. Every contender is warmed up once (untimed for the results); then
``--rounds`` rounds run both, the order rotated each round; medians of the times and the median of
the per-round ratios. The machine has 2 cores: two workers cannot use more cores than one worker
plus the driver already compete for, so 2 workers need not be faster here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from bench_peers import generate, run_cues  # noqa: E402
from common import machine_info, median, now_iso, write_json  # noqa: E402

from cues_platform.processing import OutputWriter, Strategy  # noqa: E402
from cues_platform.spark import SparkSettings, get_spark  # noqa: E402
from cues_platform.spark.cluster import Cluster, start_cluster  # noqa: E402

CONTENDERS = {"one_worker": 1, "two_workers": 2}


class Jobs:
    """bench_peers' job-group API, without counting (the runs here only need their time)."""

    def __init__(self, spark: Any) -> None:
        self.sc = spark.sparkContext

    def group(self, tag: str) -> str:
        self.sc.setJobGroup(tag, tag)
        return tag

    def count(self, name: str) -> int:
        return len(self.sc.statusTracker().getJobIdsForGroup(name))

    def clear(self) -> None:
        self.sc.setJobGroup("idle", "outside a measured run")


def attach(cluster: Cluster, workers: int, current: list[Any]) -> tuple[Any, float]:
    """A session on ``cluster`` with an executor on each worker; the seconds that took (untimed)."""
    t = time.perf_counter()
    if current:
        current.pop().stop()
    spark = get_spark(SparkSettings(master=cluster.url, app_name=f"bench-cluster-{workers}w"))
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 < workers:  # minus the driver
        time.sleep(0.1)
    spark.range(100).count()
    current.append(spark)
    return spark, time.perf_counter() - t


def once(name: str, clusters: dict[str, Cluster], data: Any, current: list[Any]) -> dict:
    spark, attach_s = attach(clusters[name], CONTENDERS[name], current)
    fx = spark.read.parquet(str(data.fx)).cache()
    fx.count()
    work = Path(tempfile.mkdtemp(prefix=f"cluster-{name}-", dir=data.root))
    try:
        run = run_cues(Strategy.EXACTLY_ONCE, writer=OutputWriter.EXECUTORS)(spark, data, fx, Jobs(spark), work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        fx.unpersist()
    return {"seconds": run.seconds, "steps": run.steps, "attach_s": attach_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="50,000 rows, 1 round, to /tmp")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows, rounds = (50_000, 1) if args.quick else (args.rows, args.rounds)
    out = args.out or (Path("/tmp/cluster-quick.json") if args.quick else HERE / "results" / "cluster.json")
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    clusters: dict[str, Cluster] = {}
    current: list[Any] = []
    try:
        for name, n in CONTENDERS.items():
            clusters[name] = start_cluster(folder=root / name, workers=n, cores=1, memory="2g", timeout=300)
        data = generate(root / "data", rows)
        names = list(CONTENDERS)
        warmup = {}
        for name in names:
            warmup[name] = round(once(name, clusters, data, current)["seconds"], 3)
            print(f"warm-up {name}: {warmup[name]} s", flush=True)
        runs: dict[str, list[dict]] = {n: [] for n in names}
        orders = []
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            orders.append(order)
            for name in order:
                runs[name].append(once(name, clusters, data, current))
                print(f"round {r} {name}: {runs[name][-1]['seconds']:.3f} s", flush=True)
    finally:
        if current:
            current.pop().stop()
        for cluster in clusters.values():
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {"benchmark": "cluster", "when": now_iso(), "machine": machine_info(),
                              # other work on the 2 cores (1-minute load average, before and after)
                              "load_average_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
                              "rows": rows, "rounds": rounds, "steps": 10, "warmup_s": warmup,
                              "orders": orders, "contenders": {}}
    for name, rs in runs.items():
        secs = [r["seconds"] for r in rs]
        result["contenders"][name] = {
            "workers": CONTENDERS[name], "seconds": [round(s, 3) for s in secs],
            "median_s": round(median(secs), 3), "rows_per_s_median": round(rows / median(secs)),
            "attach_s": [round(r["attach_s"], 2) for r in rs]}
    per_round = [round(o["seconds"] / t["seconds"], 3)
                 for o, t in zip(runs["one_worker"], runs["two_workers"], strict=True)]
    result["two_vs_one_speedup_per_round"] = per_round
    result["two_vs_one_speedup_median"] = median(per_round)
    print(f"two workers vs one: {per_round} (median {median(per_round)}; > 1: two are faster)")
    print("wrote", write_json(out, result))


if __name__ == "__main__":
    main()
