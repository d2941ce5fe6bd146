"""One append's write and commit by size: delta-rs' writer against files on a thread per core.

Run: ``.venv/bin/python bench/bench_append_files.py [--rounds 12]`` -> bench/results/append_files.json

Where ``parallel_files.PARALLEL_MIN_ROWS`` comes from (``queues/parallel_files.py``): for each
size, the same conformed table of ``bench_peers``' output shape (``PRICED``, 9 payload columns)
is appended with ``append_batches`` (a step's delivery hash and an app transaction, as a step's
commit carries) to one local queue, ``--rounds`` times each way, the two ways alternating which
goes first: ``deltars`` (the threshold out of reach: ``write_deltalake``) and ``parallel`` (the
threshold at 2 rows: pyarrow files on a thread per core, committed as add actions). The first
two rounds are warm-up; medians of the rest, and the median of per-round ratios.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from bench_peers import PRICED, chunk  # noqa: E402
from common import machine_info, median, now_iso, write_json  # noqa: E402

from cues_platform.queues import Lake, parallel_files  # noqa: E402
from cues_platform.queues.appender import append_batches  # noqa: E402

SIZES = (1_000, 10_000, 30_000, 60_000, 100_000, 1_000_000)


def priced(n: int) -> pa.Table:
    src = chunk(0, n, np.random.default_rng(1))
    return pa.table({"id": src["id"], "sender": src["sender"], "receiver": src["receiver"],
                     "currency": src["currency"], "amount": src["amount"], "rate": src["amount"],
                     "settlement_amount": src["amount"], "status": pa.repeat(pa.scalar("OK"), n),
                     "reason": pa.nulls(n, pa.string())}, schema=PRICED)


def measure(n: int, rounds: int, root: Path) -> dict:
    table = priced(n)
    queue = Lake(root=str(root / f"rows-{n}")).create_queue("p", schema=PRICED, partitions=["0"])
    seconds: dict[str, list[float]] = {"deltars": [], "parallel": []}
    original = parallel_files.PARALLEL_MIN_ROWS
    try:
        for r in range(rounds):
            for way in (["parallel", "deltars"] if r % 2 else ["deltars", "parallel"]):
                parallel_files.PARALLEL_MIN_ROWS = 2 if way == "parallel" else 2**62
                t = time.perf_counter()
                append_batches(queue, {"0": table}, delivery_hash="b" * 64,
                               app_transactions=[("bench:step", r + 1)])
                seconds[way].append(time.perf_counter() - t)
    finally:
        parallel_files.PARALLEL_MIN_ROWS = original
    kept = {w: s[2:] for w, s in seconds.items()}
    ratios = [d / p for d, p in zip(kept["deltars"], kept["parallel"], strict=True)]
    return {"rows": n, "deltars_ms_median": round(median(kept["deltars"]) * 1000, 2),
            "parallel_ms_median": round(median(kept["parallel"]) * 1000, 2),
            "speedup_median": round(median(ratios), 3),
            "seconds": {w: [round(x, 5) for x in s] for w, s in seconds.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "append_files.json")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cues-append-files-") as tmp:
        results = [measure(n, args.rounds, Path(tmp)) for n in SIZES]
    for r in results:
        print(f"{r['rows']:>9} rows: delta-rs {r['deltars_ms_median']:8.1f} ms  parallel "
              f"{r['parallel_ms_median']:8.1f} ms  speedup {r['speedup_median']:.2f}x")
    out = {"benchmark": "append_files", "at": now_iso(), "machine": machine_info(), "note": args.note,
           "config": {"rounds": args.rounds, "warmup_rounds": 2, "sizes": list(SIZES)},
           "threshold_in_code": parallel_files.PARALLEL_MIN_ROWS, "results": results}
    print("wrote", write_json(args.out, out))


if __name__ == "__main__":
    main()
