"""One big append's Parquet file: pyarrow's default dictionary encoding against dictionaries of
the variable-length columns only.

Run: ``.venv/bin/python bench/bench_parquet_encoding.py [--rows 500000] [--rounds 12]``
-> bench/results/parquet_encoding.json

Why ``queues/parallel_files.py`` dictionary-encodes only the string and binary columns
(``parallel_files.dictionary_columns``): pyarrow's default tries a dictionary for every column
and falls back to plain encoding once a column's dictionary passes its page limit, after hashing
the values up to there; a step's unique numbers (``_offset``, ids, amounts) pay that for nothing.
The table is ``bench_parquet_stats``' (one 500k-row slice of a 1M-row step's output on two
cores, the metadata columns included, the partition column dropped), written with the product's
statistics (``layout.STATS_COLUMNS`` only, snappy) ``--rounds`` times each way, the ways
alternating which goes first: ``every_column`` (pyarrow's default ``use_dictionary=True``, what
the product wrote before) and ``byte_arrays`` (what it writes now). The first two rounds are
warm-up; medians of the rest, the median of per-round ratios (every_column / byte_arrays) and
each way's file size (smaller is better: a dictionary of unique numbers only adds a page).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from bench_parquet_stats import step_slice, time_writes  # noqa: E402
from common import machine_info, median, now_iso, write_json  # noqa: E402

from cues_platform.queues.layout import STATS_COLUMNS  # noqa: E402
from cues_platform.queues.parallel_files import dictionary_columns  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "parquet_encoding.json")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cues-parquet-encoding-") as tmp:
        table = step_slice(args.rows, Path(tmp))
        stats = [c for c in STATS_COLUMNS.split(",") if c in table.column_names]
        dictionary = list(dictionary_columns(table.schema))
        ways = {"every_column": {"write_statistics": stats, "use_dictionary": True},
                "byte_arrays": {"write_statistics": stats, "use_dictionary": dictionary}}
        seconds, sizes = time_writes(table, tmp, ways, args.rounds)
    kept = {w: s[2:] for w, s in seconds.items()}
    ratios = [a / b for a, b in zip(kept["every_column"], kept["byte_arrays"], strict=True)]
    result = {w: {"ms_median": round(median(s) * 1000, 2), "bytes": sizes[w]} for w, s in kept.items()}
    print(f"{args.rows:,} rows: dictionaries of every column {result['every_column']['ms_median']:.1f} ms "
          f"({sizes['every_column']:,} bytes), of {','.join(dictionary)} only "
          f"{result['byte_arrays']['ms_median']:.1f} ms ({sizes['byte_arrays']:,} bytes), "
          f"ratio {median(ratios):.3f}")
    out = {"benchmark": "parquet_encoding", "at": now_iso(), "machine": machine_info(), "note": args.note,
           "config": {"rows": args.rows, "rounds": args.rounds, "warmup_rounds": 2, "stats_columns": stats,
                      "dictionary_columns": dictionary},
           "results": result, "ratio_every_column_over_byte_arrays_median": round(median(ratios), 3),
           "seconds": {w: [round(x, 5) for x in s] for w, s in seconds.items()}}
    print("wrote", write_json(args.out, out))


if __name__ == "__main__":
    main()
