"""A shared warm Spark (issue 13 item 2): how much sooner does a run process reach its first step
when it attaches to a Spark Connect server instead of starting its own JVM?

Run: ``.venv/bin/python bench/bench_connect.py [--rounds 5] [--quick]`` -> bench/results/connect.json

Each measurement is a fresh process (``bench/connect_child.py``) on a fresh copy of one small lake
(10,000 orders, one map, one step), timed from the moment the parent starts it:

- ``step``: what ``cues run`` does (the graph runner) — start to first step committed;
- ``materialize``: what a Dagster run process does (``materialize`` of the processor's asset).

Two contenders per mode: ``local`` (``CUES_SPARK_MASTER=local[*]``: the process starts its JVM)
and ``connect`` (``sc://127.0.0.1:PORT``: a server started once, before the rounds; its own start
is reported apart, paid once per deployment). Each contender is warmed up once, the order is
rotated every round, medians are over the rounds, and every run must deliver the 10,000 rows.
The verdict (``start_5x``: local's median start-to-first-step >= 5x Connect's, for the runner)
is computed here.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, median, now_iso, write_json  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cues_platform.spark.connect import start_connect_server  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "connect_child.py"
OUT = Path(__file__).resolve().parent / "results" / "connect.json"
TARGET = 5.0
CONTENDERS = ("local", "connect")


def run_child(*, template: Path, work: Path, mode: str, master: str) -> dict:
    lake = work / f"lake-{time.monotonic_ns()}"
    shutil.copytree(template, lake)
    env = {**os.environ, "CUES_SPARK_MASTER": master}
    t0 = time.time()
    proc = subprocess.run([sys.executable, str(CHILD), "--lake", str(lake), "--mode", mode,
                           "--t0", repr(t0)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)
    wall = time.time() - t0
    shutil.rmtree(lake, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} on {master} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["rows"] != 10_000:
        raise RuntimeError(f"{mode} on {master} delivered {result['rows']} rows, not 10000")
    return {**result, "wall_s": round(wall, 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 rounds, runner mode only")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    modes = ("step",) if args.quick else ("step", "materialize")
    work = Path(tempfile.mkdtemp(prefix="bench-connect-"))
    template = work / "template"
    subprocess.run([sys.executable, str(CHILD), "--lake", str(template), "--mode", "prepare"],
                   check=True, cwd=ROOT)
    t = time.monotonic()
    server = start_connect_server(folder=work / "server", python_path=ROOT)
    server_start = time.monotonic() - t
    masters = {"local": "local[*]", "connect": server.url}
    results: dict[str, dict] = {}
    try:
        for mode in modes:
            samples: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
            for c in CONTENDERS:  # warm-up: page cache, the server's first plans
                run_child(template=template, work=work, mode=mode, master=masters[c])
            for r in range(rounds):
                order = CONTENDERS[r % 2:] + CONTENDERS[:r % 2]
                for c in order:
                    samples[c].append(run_child(template=template, work=work, mode=mode, master=masters[c]))
                    print(f"{mode} round {r} {c}: {samples[c][-1]}", flush=True)
            med = {c: {k: median([s[k] for s in samples[c]]) for k in ("spark_ready_s", "first_step_s", "wall_s")}
                   for c in CONTENDERS}
            per_round = [round(samples["local"][i]["first_step_s"] / samples["connect"][i]["first_step_s"], 2)
                         for i in range(rounds)]
            results[mode] = {"samples": samples, "median": med, "start_ratio_per_round": per_round,
                             "start_ratio": round(med["local"]["first_step_s"] / med["connect"]["first_step_s"], 2),
                             "wall_ratio": round(med["local"]["wall_s"] / med["connect"]["wall_s"], 2)}
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    verdict = {"start_5x": {"target": f"local start-to-first-step >= {TARGET}x Connect's (runner)",
                            "ratio": results["step"]["start_ratio"],
                            "pass": results["step"]["start_ratio"] >= TARGET}}
    write_json(args.out, {"benchmark": "connect", "when": now_iso(), "machine": machine_info(),
                          "rounds": rounds, "server_start_s": round(server_start, 2),
                          "results": results, "verdict": verdict})
    print(json.dumps({m: {"start_ratio": v["start_ratio"], "wall_ratio": v["wall_ratio"], "median": v["median"]}
                      for m, v in results.items()}, indent=1))
    print(f"server start {server_start:.1f} s; start_5x: {'PASS' if verdict['start_5x']['pass'] else 'FAIL'}")


if __name__ == "__main__":
    main()
