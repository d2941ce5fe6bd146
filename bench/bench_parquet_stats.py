"""One big append's Parquet file: statistics of every column against the queue's STATS columns only.

Run: ``.venv/bin/python bench/bench_parquet_stats.py [--rows 500000] [--rounds 12]``
-> bench/results/parquet_stats.json

Why ``queues/parallel_files.py`` writes Parquet statistics of ``layout.STATS_COLUMNS`` only: the
queue's Delta statistics are of those columns, and a reader prunes a queue's files by offset
range. The table is one slice of a 1M-row step's output on two cores (``--rows``, default
500,000): ``bench_peers``' output shape (``PRICED``, 9 payload columns) with the metadata columns
the appender adds (``appender._with_metadata``: a step's delivery hash, the append time), the
partition column dropped as ``write_parts`` drops it. It is written with ``pq.write_table`` (snappy)
``--rounds`` times each way, the two ways alternating which goes first: ``all`` (pyarrow's
default, statistics of every column) and ``stats_only`` (what the product writes). The first two
rounds are warm-up; medians of the rest, and the median of per-round ratios (all / stats_only).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from bench_append_files import priced  # noqa: E402
from bench_peers import PRICED  # noqa: E402
from common import machine_info, median, now_iso, write_json  # noqa: E402

from cues_platform.queues import Lake  # noqa: E402
from cues_platform.queues.appender import AppendOptions, _with_metadata  # noqa: E402
from cues_platform.queues.layout import STATS_COLUMNS  # noqa: E402
from cues_platform.queues.schema import PARTITION  # noqa: E402


def step_slice(rows: int, root: Path) -> pa.Table:
    """A step's rows as the appender hands them to ``write_parts`` (the queue's table schema)."""
    queue = Lake(root=str(root / "lake")).create_queue("p", schema=PRICED, partitions=["0"])
    now = pa.scalar(int(time.time() * 1_000_000), pa.timestamp("us", tz="UTC"))
    table = _with_metadata(priced(rows), partition="0", start=0, opts=AppendOptions(delivery_hash="b" * 64),
                           now=now, schema=queue.table_schema, based=False)
    return table.drop_columns([PARTITION])


def time_writes(table: pa.Table, folder: str, ways: dict[str, dict], rounds: int
                ) -> tuple[dict[str, list[float]], dict[str, int]]:
    """``table`` written ``rounds`` times each way (snappy plus the way's ``pq.write_table``
    arguments), the ways alternating which goes first; each way's seconds per round and its
    file's size. A file that does not read back with every row stops the benchmark."""
    seconds: dict[str, list[float]] = {w: [] for w in ways}
    sizes: dict[str, int] = {}
    for r in range(rounds):
        for way in (list(ways) if r % 2 == 0 else list(reversed(ways))):
            path = os.path.join(folder, f"{way}-{r}.parquet")
            t = time.perf_counter()
            pq.write_table(table, path, compression="snappy", **ways[way])
            seconds[way].append(time.perf_counter() - t)
            sizes[way] = os.path.getsize(path)
            if pq.read_table(path).num_rows != table.num_rows:
                raise SystemExit(f"{way}: the file does not hold the {table.num_rows} rows written")
    return seconds, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "parquet_stats.json")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cues-parquet-stats-") as tmp:
        table = step_slice(args.rows, Path(tmp))
        stats = [c for c in STATS_COLUMNS.split(",") if c in table.column_names]
        ways = {"all": {"write_statistics": True}, "stats_only": {"write_statistics": stats}}
        seconds, sizes = time_writes(table, tmp, ways, args.rounds)
    kept = {w: s[2:] for w, s in seconds.items()}
    ratios = [a / b for a, b in zip(kept["all"], kept["stats_only"], strict=True)]
    result = {w: {"ms_median": round(median(s) * 1000, 2), "bytes": sizes[w]} for w, s in kept.items()}
    print(f"{args.rows:,} rows: every column {result['all']['ms_median']:.1f} ms, "
          f"{','.join(stats)} only {result['stats_only']['ms_median']:.1f} ms, "
          f"ratio {median(ratios):.3f}")
    out = {"benchmark": "parquet_stats", "at": now_iso(), "machine": machine_info(), "note": args.note,
           "config": {"rows": args.rows, "rounds": args.rounds, "warmup_rounds": 2, "stats_columns": stats},
           "results": result, "ratio_all_over_stats_only_median": round(median(ratios), 3),
           "seconds": {w: [round(x, 5) for x in s] for w, s in seconds.items()}}
    print("wrote", write_json(args.out, out))


if __name__ == "__main__":
    main()
