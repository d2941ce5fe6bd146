"""Checkpoint size and snapshot load time of a queue with 100,000 short-lived producer ids, before
and after their app transactions expire (issue 23, item 2).

A producer id leaves ``prod:{id}`` and ``pepoch:{id}`` in the queue table. Before issue 23 they
had no ``lastUpdated`` and stayed in every checkpoint for ever; now the appender stamps them
(``cues_platform.clock.now_ms``) and ``set_app_transaction_retention`` (1 day) expires them.

Workload, in one queue with the retention set: ``--ids`` producer ids whose ``prod:``/``pepoch:``
are written by the platform's appender (``append_batches(..., app_transactions=...)``, the path a
producer's send takes, so the stamps are the real ones), ``--per-commit`` ids per commit, commits without rows (a
commit may carry many app transactions: 100,000 ids as 200,000 one-id commits of real producers,
an open and a send each, would take hours on this machine). Their stamps are ``1 day - margin``
old (the platform clock moved back), so delta-rs expires them ``--margin`` seconds later. One
live producer (real ``Producer``, sending after the expiry) and the partition offset stay.

Measured: the newest checkpoint's bytes and the median time to load a snapshot
(``DeltaTable(uri)`` + one ``transaction_version``) before the expiry, after it (checkpoint
written again), and for a baseline queue holding only the live producer. PASS when, after the
expiry, every short-lived id is gone, the live producer and the offsets are intact, the
checkpoint is at most 1.5x the baseline's bytes + 4 KiB, and the load time at most 2x the
baseline's + 20 ms.

    python bench/bench_expiry.py --ids 100000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_info, now_iso, write_json  # noqa: E402
from deltalake import DeltaTable  # noqa: E402

from cues_platform import clock  # noqa: E402
from cues_platform.queues import Lake  # noqa: E402
from cues_platform.queues.appender import append_batches  # noqa: E402
from cues_platform.queues.maintenance import checkpoint, set_app_transaction_retention  # noqa: E402

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
DAY_S = 86_400
LOADS = 7


def checkpoint_bytes(uri: str) -> int:
    newest = sorted(Path(uri, "_delta_log").glob("*.checkpoint.parquet"))[-1]
    return newest.stat().st_size


def load_seconds(uri: str) -> float:
    runs = []
    for _ in range(LOADS):
        t0 = time.perf_counter()
        DeltaTable(uri).transaction_version("part:0")
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def measure(q) -> dict:
    checkpoint(q)
    return {"version": q.refresh().version(), "checkpoint_bytes": checkpoint_bytes(q.uri),
            "load_seconds": round(load_seconds(q.uri), 5)}


def live_producer(q, start: int) -> None:
    q.producer(producer_id="live").send(pa.table({"id": [start]}, schema=SCHEMA), partition="0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=100_000)
    parser.add_argument("--per-commit", type=int, default=1_000)
    parser.add_argument("--margin", type=float, default=120.0,
                        help="seconds between the stamps and their expiry (covers the writes "
                             "and the 'before' measurement)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "expiry.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lake = Lake(root=str(Path(tmp) / "lake"))
        base = lake.create_queue("baseline", schema=SCHEMA)
        set_app_transaction_retention(base, days=1)
        live_producer(base, 0)
        baseline = measure(base)

        q = lake.create_queue("events", schema=SCHEMA)
        set_app_transaction_retention(q, days=1)
        live_producer(q, 0)
        clock.advance(seconds=-(DAY_S - args.margin))
        deadline = time.monotonic() + args.margin
        t0 = time.perf_counter()
        commits = 0
        for first in range(0, args.ids, args.per_commit):
            chunk = range(first, min(first + args.per_commit, args.ids))
            txns = [(f"{kind}:short-{i}", 0) for i in chunk for kind in ("prod", "pepoch")]
            append_batches(q, {}, allow_empty=True, app_transactions=txns)  # no rows, no files
            commits += 1
        write_seconds = time.perf_counter() - t0
        clock.reset()
        before = measure(q)
        before["short_lived_ids_present"] = sum(
            DeltaTable(q.uri).transaction_version(f"prod:short-{i}") is not None
            for i in (0, args.ids // 2, args.ids - 1))
        if time.monotonic() > deadline:
            sys.exit(f"the writes and the 'before' measurement took longer than --margin "
                     f"{args.margin} s: the ids expired before they were measured; raise it")
        print(f"before: {before} ({commits} commits in {write_seconds:.1f} s)", flush=True)
        while DeltaTable(q.uri).transaction_version(f"prod:short-{args.ids - 1}") is not None:
            time.sleep(1.0)  # delta-rs expires them against the real clock
        live_producer(q, 1)  # a new version, the live producer active again
        after = measure(q)
        dt = DeltaTable(q.uri)
        gone = all(dt.transaction_version(f"{kind}:short-{i}") is None
                   for i in range(0, args.ids, max(1, args.ids // 1000)) for kind in ("prod", "pepoch"))
        intact = (dt.transaction_version("part:0") == 2
                  and dt.transaction_version("prod:live") == 1
                  and dt.transaction_version("pepoch:live") is not None)
        after.update({"short_lived_ids_gone": gone, "live_producer_and_offsets_intact": intact})
        print(f"after: {after}; baseline: {baseline}", flush=True)

    size_bound = 1.5 * baseline["checkpoint_bytes"] + 4096
    load_bound = 2 * baseline["load_seconds"] + 0.020
    ok = (gone and intact and after["checkpoint_bytes"] <= size_bound
          and after["load_seconds"] <= load_bound)
    verdict = "PASS" if ok else "FAIL"
    print(f"checkpoint {before['checkpoint_bytes']} -> {after['checkpoint_bytes']} bytes "
          f"(bound {size_bound:.0f}), load {before['load_seconds']} -> {after['load_seconds']} s "
          f"(bound {load_bound:.4f}) -> {verdict}")
    write_json(args.out, {
        "benchmark": "expiry", "at": now_iso(), "machine": machine_info(),
        "ids": args.ids, "ids_per_commit": args.per_commit, "commits": commits,
        "write_seconds": round(write_seconds, 2), "retention": "1 day",
        "stamps": f"1 day - {args.margin:g} s old (platform clock moved back)",
        "baseline": baseline, "before_expiry": before, "after_expiry": after,
        "target": "after expiry: every short-lived id gone, live producer and offsets intact, "
                  "checkpoint <= 1.5x baseline + 4 KiB, load <= 2x baseline + 20 ms",
        "bounds": {"checkpoint_bytes": round(size_bound), "load_seconds": round(load_bound, 5)},
        "verdict": verdict,
    })


if __name__ == "__main__":
    main()
