"""Queue benchmarks: append throughput, commit latency, range reads and open cost vs log length.

Run from the repository root::

    .venv/bin/python bench/bench_queues.py            # full run (~5-10 min on 2 cores), writes
                                                      # bench/results/queues.json
    .venv/bin/python bench/bench_queues.py --quick    # smoke check (~1 min), writes to /tmp

Every measurement is a median over several runs (the count is in the JSON next to each number).
Wall time spent in the main steps of the queue code (snapshot refresh, Delta statistics, the
delta-rs write) is recorded on the timed runs themselves by thin wrappers (``common.Profiler``;
overhead ~1 us per wrapped call), so the breakdowns explain the same runs the medians come from.

See docs/benchmarks.md for the results and how to read them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    Profiler,
    machine_info,
    median,
    now_iso,
    percentile,
    summarize,
    time_runs,
    write_json,
)
from deltalake import DeltaTable  # noqa: E402

import cues_platform.queues.appender as appender_mod  # noqa: E402
import cues_platform.queues.parallel_files as parallel_mod  # noqa: E402
import cues_platform.queues.reader as reader_mod  # noqa: E402
from cues_platform.queues import (  # noqa: E402
    Lake,
    Queue,
    maintenance,  # noqa: E402
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "queues.json"
PARTITION = "0"

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("amount", pa.float64()),
        ("currency", pa.string()),
        ("account", pa.string()),
    ]
)
CURRENCIES = pa.array(["EUR", "USD", "GBP", "CHF", "JPY", "SEK", "NOK", "PLN"])

# Sizes: full run vs --quick smoke run.
FULL = {
    "append_sizes": [1_000, 100_000, 1_000_000],
    "append_runs": {1_000: 20, 100_000: 10, 1_000_000: 7},
    "small_appends": 200,
    "small_rows": 10,
    "growth_commits": 1_000,
    "growth_bucket": 100,
    "after_compact_appends": 50,
    "range_batches": 10,
    "range_batch_rows": 1_000_000,
    "range_read": 100_000,
    "read_runs": 7,
    "few_commits": 10,
    "many_commits": 10_000,
    "commit_rows": 10,
    "tail_read": 100,
    "open_runs": 15,
    "open_runs_no_checkpoint": 5,
    "big_queue_appends": 3,
}
QUICK = {
    "append_sizes": [1_000, 10_000, 50_000],
    "append_runs": {1_000: 5, 10_000: 3, 50_000: 3},
    "small_appends": 30,
    "small_rows": 10,
    "growth_commits": 200,
    "growth_bucket": 50,
    "after_compact_appends": 10,
    "range_batches": 10,
    "range_batch_rows": 20_000,
    "range_read": 10_000,
    "read_runs": 3,
    "few_commits": 10,
    "many_commits": 300,
    "commit_rows": 10,
    "tail_read": 100,
    "open_runs": 5,
    "open_runs_no_checkpoint": 3,
    "big_queue_appends": 2,
}

TARGETS = {
    "append_1m_s": 0.5,
    "commit_overhead_p50_ms": 15.0,
    "range_read_s": 1.0,
    "open_read_ratio": 1.5,
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def payload(n: int, seed: int = 0) -> pa.Table:
    """A realistic payment-like batch: int64 id, float64 amount, 3-letter currency, account id."""
    rng = np.random.default_rng(seed)
    accounts = pc.binary_join_element_wise(
        "acct-",
        pc.utf8_lpad(pc.cast(pa.array(rng.integers(0, 1_000_000, n)), pa.string()), 8, "0"),
        "",
    )
    return pa.table(
        {
            "id": pa.array(np.arange(n, dtype=np.int64)),
            "amount": pa.array(np.round(rng.random(n) * 1000, 2)),
            "currency": pc.take(CURRENCIES, pa.array(rng.integers(0, len(CURRENCIES), n))),
            "account": accounts,
        },
        schema=SCHEMA,
    )


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def append_targets(prof: Profiler) -> Any:
    """Wrappers for the steps of ``append_batches`` (see cues_platform/queues/appender.py)."""
    return prof.patch(
        (appender_mod, "prepare_batches", "prepare_batches (conform)"),
        (Queue, "refresh", "queue.refresh (update_incremental)"),
        (Queue, "next_offset", "queue.next_offset"),
        (appender_mod, "_with_metadata", "_with_metadata"),
        (appender_mod, "write_deltalake", "write_deltalake"),
        # appends of >= parallel_files.PARALLEL_MIN_ROWS rows (since 2026-11-29): a file per core
        (parallel_mod, "write_parts", "parallel_files.write_parts (write + commit)"),
    )


def read_targets(prof: Profiler) -> Any:
    return prof.patch(
        (Lake, "open_table", "open DeltaTable (Lake.open_table)"),
        (Queue, "_load_metadata", "queue._load_metadata"),
        (reader_mod, "plan_read", "plan_read (total)"),
        (Queue, "refresh", "queue.refresh (update_incremental)"),
        (Queue, "files", "queue.files (stats -> FileInfo)"),
        (DeltaTable, "get_add_actions", "DeltaTable.get_add_actions"),
        (reader_mod, "execute_arrow", "execute_arrow (Parquet read)"),
        (reader_mod, "execute_spark", "execute_spark (plan DataFrame)"),
    )


# -- 1. append throughput -----------------------------------------------------------------------
def bench_append_throughput(lake: Lake, cfg: dict) -> dict:
    out = {}
    for n in cfg["append_sizes"]:
        q = lake.create_queue(f"append_{n}", schema=SCHEMA, partitions=[PARTITION])
        data = payload(n, seed=n)
        t0 = time.perf_counter()
        q.append(data, partition=PARTITION)  # warm-up (first write of the process / queue)
        first = time.perf_counter() - t0
        prof = Profiler()
        runs = cfg["append_runs"][n]
        with append_targets(prof):
            secs = time_runs(lambda q=q, data=data: q.append(data, partition=PARTITION), runs)
        med = median(secs)
        out[str(n)] = {
            "rows_per_batch": n,
            "runs": runs,
            "seconds_per_batch": summarize(secs),
            "rows_per_s_median": round(n / med),
            "mb_per_s_median": round(data.nbytes / med / 1e6, 1),
            "payload_bytes": data.nbytes,
            "first_append_s": round(first, 6),
            "breakdown_ms_per_append": prof.per_call_ms(runs),
        }
        log(f"append {n:>9,} rows: median {med * 1000:8.1f} ms  ({n / med:,.0f} rows/s)")
    return out


# -- 2. small appends + latency growth ----------------------------------------------------------
def bench_small_appends(lake: Lake, cfg: dict) -> tuple[dict, dict]:
    q = lake.create_queue("small", schema=SCHEMA, partitions=[PARTITION])
    data = payload(cfg["small_rows"], seed=1)
    q.append(data, partition=PARTITION)  # warm-up
    prof = Profiler()
    with append_targets(prof):
        secs = time_runs(lambda: q.append(data, partition=PARTITION), cfg["small_appends"])
    small = {
        "appends": cfg["small_appends"],
        "rows_per_append": cfg["small_rows"],
        "note": "fresh queue; append i adds the table's i-th data file (1 file per commit)",
        "latency": summarize(secs),
        "p50_ms": ms(percentile(secs, 50)),
        "p99_ms": ms(percentile(secs, 99)),
        "first_half_p50_ms": ms(median(secs[: len(secs) // 2])),
        "second_half_p50_ms": ms(median(secs[len(secs) // 2 :])),
        "breakdown_ms_per_append": prof.per_call_ms(len(secs)),
    }
    log(f"small appends: p50 {small['p50_ms']:.1f} ms, p99 {small['p99_ms']:.1f} ms")

    # Keep appending to the same queue: how does commit latency depend on the table's size?
    bucket = cfg["growth_bucket"]
    curve = []
    version = q.version()
    while version < cfg["growth_commits"]:
        prof = Profiler()
        lat = []
        with append_targets(prof):
            for _ in range(bucket):
                t0 = time.perf_counter()
                res = q.append(data, partition=PARTITION)
                lat.append(time.perf_counter() - t0)
        version = res.version
        files = len(q.files(partition=PARTITION))
        curve.append(
            {
                "version_after": version,
                "data_files_after": files,
                "p50_ms": ms(median(lat)),
                "p99_ms": ms(percentile(lat, 99)),
                "breakdown_ms_per_append": prof.per_call_ms(bucket),
            }
        )
        log(f"  growth: version {version:>5}, {files:>5} files: p50 {median(lat) * 1000:6.1f} ms")
    growth: dict[str, Any] = {
        "bucket_appends": bucket,
        "handle": "one long-lived Queue handle for all appends",
        "curve": curve,
    }

    # Open + read of the last offsets on this queue, built only with Queue.append (so with
    # delta-rs's automatic checkpoints), before and after compaction.
    growth["open_read_before_compaction"] = measure_open(
        lake.root, q.name, q.next_offset(PARTITION), cfg, cfg["open_runs"]
    )
    log(
        f"  open+read at version {version}: {growth['open_read_before_compaction']['median_ms']:.1f} ms"
    )

    # Same table, same log length, few files: compaction removes the per-file cost?
    t0 = time.perf_counter()
    report = maintenance.compact(q)
    growth["compact_s"] = round(time.perf_counter() - t0, 3)
    growth["compact_files_removed"] = report.files_removed
    growth["compact_files_added"] = report.files_added
    prof = Profiler()
    with append_targets(prof):
        secs = time_runs(lambda: q.append(data, partition=PARTITION), cfg["after_compact_appends"])
    growth["after_compaction"] = {
        "version_after": q.version(),
        "data_files_after": len(q.files(partition=PARTITION)),
        "p50_ms": ms(median(secs)),
        "p99_ms": ms(percentile(secs, 99)),
        "breakdown_ms_per_append": prof.per_call_ms(len(secs)),
    }
    log(f"  after compaction: p50 {median(secs) * 1000:.1f} ms")
    growth["open_read_after_compaction"] = measure_open(
        lake.root, q.name, q.next_offset(PARTITION), cfg, cfg["open_runs"]
    )
    return small, growth


def bench_growth_reopened(lake: Lake, cfg: dict) -> dict:
    """The growth curve again, on a new queue, but with a NEW ``Queue`` handle (fresh delta-rs
    snapshot loaded from the last checkpoint) for every bucket of appends. Separates the cost of
    the table's size from the cost of a long-lived handle's incrementally updated snapshot."""
    name = "small_reopened"
    lake.create_queue(name, schema=SCHEMA, partitions=[PARTITION])
    data = payload(cfg["small_rows"], seed=1)
    bucket = cfg["growth_bucket"]
    curve = []
    version = 0
    while version < cfg["growth_commits"]:
        t0 = time.perf_counter()
        q = lake.queue(name)
        open_s = time.perf_counter() - t0
        prof = Profiler()
        lat = []
        with append_targets(prof):
            for _ in range(bucket):
                t0 = time.perf_counter()
                res = q.append(data, partition=PARTITION)
                lat.append(time.perf_counter() - t0)
        version = res.version
        curve.append(
            {
                "version_after": version,
                "data_files_after": len(q.files(partition=PARTITION)),
                "open_handle_ms": ms(open_s),
                "p50_ms": ms(median(lat)),
                "p99_ms": ms(percentile(lat, 99)),
                "first_10_p50_ms": ms(median(lat[:10])),
                "last_10_p50_ms": ms(median(lat[-10:])),
                "breakdown_ms_per_append": prof.per_call_ms(bucket),
            }
        )
        log(
            f"  reopened growth: version {version:>5}: p50 {median(lat) * 1000:6.1f} ms "
            f"(first 10 {median(lat[:10]) * 1000:.1f}, last 10 {median(lat[-10:]) * 1000:.1f})"
        )
    return {
        "bucket_appends": bucket,
        "handle": "new Lake.queue() handle per bucket",
        "curve": curve,
    }


# -- 3. range reads ------------------------------------------------------------------------------
def bench_range_read(lake: Lake, cfg: dict) -> dict:
    from pyspark.sql import functions as F

    from cues_platform.spark import get_spark

    q = lake.create_queue("range", schema=SCHEMA, partitions=[PARTITION])
    batch = payload(cfg["range_batch_rows"], seed=3)
    t0 = time.perf_counter()
    for _ in range(cfg["range_batches"]):
        q.append(batch, partition=PARTITION)
    build_s = time.perf_counter() - t0
    total = cfg["range_batches"] * cfg["range_batch_rows"]
    files = q.files(partition=PARTITION)
    log(f"range queue: {total:,} rows in {len(files)} files, built in {build_s:.1f} s")
    n = cfg["range_read"]
    start = total // 2 - n // 2
    end = start + n
    runs = cfg["read_runs"]

    def arrow_read() -> pa.Table:
        t = q.read_arrow(partition=PARTITION, start=start, end=end)
        assert t.num_rows == n, t.num_rows
        return t

    def plan() -> Any:
        return reader_mod.plan_read(q, partition=PARTITION, start=start, end=end)

    result: dict[str, Any] = {
        "queue_rows": total,
        "queue_files": len(files),
        "build_s": round(build_s, 3),
        "range": [start, end],
        "rows_read": n,
        "files_touched": len(plan().files),
        "runs": runs,
    }
    arrow_read()  # warm-up
    prof = Profiler()
    with read_targets(prof):
        secs = time_runs(arrow_read, runs)
    result["arrow"] = {"latency": summarize(secs), "breakdown_ms": prof.per_call_ms(runs)}
    result["plan_only"] = {"latency": summarize(time_runs(plan, runs))}
    log(f"  arrow read: {median(secs) * 1000:.1f} ms")

    t0 = time.perf_counter()
    spark = get_spark()
    result["spark_session_start_s"] = round(time.perf_counter() - t0, 3)
    frame = lambda: q.read_spark(spark, partition=PARTITION, start=start, end=end)  # noqa: E731

    def count() -> int:
        c = frame().count()
        assert c == n, c
        return c

    def to_arrow() -> pa.Table:
        t = frame().toArrow()
        assert t.num_rows == n, t.num_rows
        return t

    def agg_sum() -> Any:
        return frame().agg(F.sum("amount"), F.count("*")).collect()

    # Warm-up: first Spark jobs (JVM JIT, Parquet reader classes) on another range.
    t0 = time.perf_counter()
    w = q.read_spark(spark, partition=PARTITION, start=0, end=n)
    w.count()
    w.toArrow()
    w.agg(F.sum("amount")).collect()
    result["spark_warmup_s"] = round(time.perf_counter() - t0, 3)
    for label, fn in (
        ("spark_count", count),
        ("spark_to_arrow", to_arrow),
        ("spark_agg_sum", agg_sum),
    ):
        prof = Profiler()
        with read_targets(prof):
            secs = time_runs(fn, runs, warmup=1)
        result[label] = {"latency": summarize(secs), "breakdown_ms": prof.per_call_ms(runs + 1)}
        log(f"  {label}: {median(secs) * 1000:.1f} ms")
    return result


# -- 4. open + read vs number of commits ---------------------------------------------------------
def build_commits_fast(q: Queue, commits: int, rows: int, *, template_version: int = 1) -> float:
    """Bring ``q`` (which holds exactly one append of ``rows`` rows, made by ``Queue.append``) to
    ``commits`` appends by writing commits 2..N directly: for each, a ``rows``-row Parquet file
    (the first file with its ``_offset`` column renumbered) and a log entry that copies the first
    commit's actions (commitInfo, add with statistics, txn ``part:0``) with the new path, offsets
    and versions. This is what ``Queue.append`` would write, without its per-commit cost that
    grows with the table (see the growth curve), which would make 10,000 commits take hours.
    No checkpoint is written; the caller decides. Returns the seconds spent.

    ``template_version`` is the log version of that first append (1 for a plain queue; later when
    other commits came first, as the backing queue's epoch fence). Other app transactions of the
    template (a backing queue's epoch) are copied unchanged."""
    t0 = time.perf_counter()
    root = Path(q.uri)
    log_dir = root / "_delta_log"
    lines = [json.loads(line) for line in (log_dir / f"{template_version:020d}.json").read_text().splitlines()]
    commit_info = next(a["commitInfo"] for a in lines if "commitInfo" in a)
    add = next(a["add"] for a in lines if "add" in a)
    txns = [a["txn"] for a in lines if "txn" in a]
    txn = next(t for t in txns if t["appId"] == f"part:{PARTITION}")
    others = [{"txn": t} for t in txns if t is not txn]
    assert txn["appId"] == f"part:{PARTITION}" and txn["version"] == rows, txn
    template = pq.ParquetFile(root / add["path"]).read()
    offset_idx = template.schema.get_field_index("_offset")
    stats = json.loads(add["stats"])
    folder = Path(add["path"]).parent
    for version in range(template_version + 1, template_version + commits):
        start = (version - template_version) * rows
        data = template.set_column(
            offset_idx,
            template.schema.field(offset_idx),
            pa.array(np.arange(start, start + rows, dtype=np.int64)),
        )
        rel = str(folder / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet")
        pq.write_table(data, root / rel, compression="snappy")
        now_ms = int(time.time() * 1000)
        stats["minValues"]["_offset"] = start
        stats["maxValues"]["_offset"] = start + rows - 1
        entry = [
            {
                "commitInfo": {
                    **commit_info,
                    "timestamp": now_ms,
                    "cues.ranges": f"{PARTITION}:{start}-{start + rows}",
                }
            },
            {
                "add": {
                    **add,
                    "path": rel,
                    "size": (root / rel).stat().st_size,
                    "modificationTime": now_ms,
                    "stats": json.dumps(stats, separators=(",", ":")),
                }
            },
            {"txn": {"appId": txn["appId"], "version": start + rows}},
            *others,
        ]
        text = "\n".join(json.dumps(a, separators=(",", ":")) for a in entry) + "\n"
        with open(log_dir / f"{version:020d}.json", "x") as fh:  # never overwrite a version
            fh.write(text)
    return time.perf_counter() - t0


def open_and_read(root: str, name: str, end: int, n: int) -> pa.Table:
    """What a new process does: open the lake and the queue, read the last ``n`` offsets."""
    q = Lake(root=root).queue(name)
    t = q.read_arrow(partition=PARTITION, start=end - n, end=end)
    assert t.num_rows == n, t.num_rows
    return t


def measure_open(root: str, name: str, end: int, cfg: dict, runs: int) -> dict:
    open_and_read(root, name, end, cfg["tail_read"])  # warm-up (page cache, imports)
    prof = Profiler()
    with read_targets(prof):
        secs = time_runs(lambda: open_and_read(root, name, end, cfg["tail_read"]), runs)
    q = Lake(root=root).queue(name)
    checkpoints = sorted(p.name for p in Path(q.uri, "_delta_log").glob("*.checkpoint.parquet"))
    return {
        "runs": runs,
        "delta_version": q.version(),
        "data_files": len(q.files()),
        "log_json_files": len(list(Path(q.uri, "_delta_log").glob("*.json"))),
        "last_checkpoint": checkpoints[-1] if checkpoints else None,
        "latency": summarize(secs),
        "median_ms": ms(median(secs)),
        "breakdown_ms": prof.per_call_ms(runs),
    }


def bench_open_read(lake: Lake, cfg: dict) -> dict:
    rows = cfg["commit_rows"]
    root = lake.root
    out: dict[str, Any] = {
        "read": f"fresh Lake(root).queue(name) + read_arrow of the last {cfg['tail_read']} offsets",
        "rows_per_commit": rows,
    }
    data = payload(rows, seed=4)

    few = lake.create_queue("commits_few", schema=SCHEMA, partitions=[PARTITION])
    for _ in range(cfg["few_commits"]):
        few.append(data, partition=PARTITION)
    end_few = cfg["few_commits"] * rows
    out["few"] = {
        "commits": cfg["few_commits"],
        **measure_open(root, "commits_few", end_few, cfg, cfg["open_runs"]),
    }
    log(f"open+read at {cfg['few_commits']} commits: {out['few']['median_ms']:.1f} ms")

    many_n = cfg["many_commits"]
    many = lake.create_queue("commits_many", schema=SCHEMA, partitions=[PARTITION])
    many.append(data, partition=PARTITION)
    build_s = build_commits_fast(many, many_n, rows)
    end_many = many_n * rows
    check = Lake(root=root).queue("commits_many")
    assert check.version() == many_n, check.version()
    assert check.next_offset(PARTITION) == end_many
    assert len(check.files()) == many_n
    got = check.read_arrow(partition=PARTITION, start=end_many - 1000, end=end_many)["_offset"]
    assert got.to_pylist() == list(range(end_many - 1000, end_many))
    out["many_build"] = {
        "method": "1 Queue.append + commits 2..N written directly (same actions as Queue.append)",
        "seconds": round(build_s, 3),
    }
    log(f"built {many_n:,} commits directly in {build_s:.1f} s")

    out["many_no_checkpoint"] = {
        "commits": many_n,
        **measure_open(root, "commits_many", end_many, cfg, cfg["open_runs_no_checkpoint"]),
    }
    log(
        f"open+read at {many_n} commits, no checkpoint: {out['many_no_checkpoint']['median_ms']:.1f} ms"
    )

    t0 = time.perf_counter()
    maintenance.checkpoint(Lake(root=root).queue("commits_many"))
    out["checkpoint_s"] = round(time.perf_counter() - t0, 3)
    out["many"] = {
        "commits": many_n,
        **measure_open(root, "commits_many", end_many, cfg, cfg["open_runs"]),
    }
    log(f"open+read at {many_n} commits, checkpointed: {out['many']['median_ms']:.1f} ms")

    # What a real append costs on this table (one data file per commit so far).
    q = Lake(root=root).queue("commits_many")
    secs = []
    for _ in range(cfg["big_queue_appends"]):
        t0 = time.perf_counter()
        q.append(data, partition=PARTITION)
        secs.append(time.perf_counter() - t0)
    out["append_on_many"] = {
        "appends": len(secs),
        "data_files_before": many_n,
        "latency": summarize(secs),
        "median_ms": ms(median(secs)),
    }
    log(f"append of {rows} rows on the {many_n}-file queue: {median(secs) * 1000:.0f} ms")

    # Same long log, few files: separates log length from file count.
    t0 = time.perf_counter()
    maintenance.compact(q)
    maintenance.checkpoint(q)
    out["compact_and_checkpoint_s"] = round(time.perf_counter() - t0, 3)
    end_after = end_many + len(secs) * rows
    out["many_compacted"] = {
        "commits": Lake(root=root).queue("commits_many").version(),
        **measure_open(root, "commits_many", end_after, cfg, cfg["open_runs"]),
    }
    log(f"open+read after compaction: {out['many_compacted']['median_ms']:.1f} ms")

    # Maintained as a long-lived queue is: `maintain` trims log entries and tombstones older than
    # the table's retention. This history is seconds old, so emulate its age by setting both
    # retentions to 0 before maintaining (a deployment sets them with `create_queue(properties=)`).
    aged = Lake(root=root).queue("commits_many")
    aged.refresh().alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 0 hours",
         "delta.deletedFileRetentionDuration": "interval 0 hours"})
    maintenance.maintain(aged, retention_hours=0, unsafe_allow_short_retention=True)
    out["many_maintained"] = {
        "commits": Lake(root=root).queue("commits_many").version(),
        "log_entries": len(os.listdir(Path(aged.uri) / "_delta_log")),
        **measure_open(root, "commits_many", end_after, cfg, cfg["open_runs"]),
    }
    log(f"open+read maintained (log trimmed): {out['many_maintained']['median_ms']:.1f} ms")

    few_ms = out["few"]["median_ms"]
    out["ratio_many_to_few"] = round(out["many"]["median_ms"] / few_ms, 2)
    out["ratio_many_no_checkpoint_to_few"] = round(
        out["many_no_checkpoint"]["median_ms"] / few_ms, 2
    )
    out["ratio_many_compacted_to_few"] = round(out["many_compacted"]["median_ms"] / few_ms, 2)
    out["ratio_many_maintained_to_few"] = round(out["many_maintained"]["median_ms"] / few_ms, 2)
    return out


def evaluate_targets(res: dict, quick: bool) -> list[dict]:
    rows = []

    def add(name: str, measured: float, target: float, unit: str, note: str = "") -> None:
        rows.append(
            {
                "target": name,
                "threshold": target,
                "measured": measured,
                "unit": unit,
                "pass": None if quick else bool(measured <= target),
                "note": ("quick run: smaller sizes, not comparable; " if quick else "") + note,
            }
        )

    largest = str(max(int(k) for k in res["append_throughput"]))
    add(
        f"append of {int(largest):,} rows <= 0.5 s",
        res["append_throughput"][largest]["seconds_per_batch"]["median_s"],
        TARGETS["append_1m_s"],
        "s",
    )
    add(
        "commit overhead (small append p50) <= 15 ms",
        res["small_appends"]["p50_ms"],
        TARGETS["commit_overhead_p50_ms"],
        "ms",
        f"{res['small_appends']['appends']} appends of {res['small_appends']['rows_per_append']} rows on a fresh queue",
    )
    rr = res["range_read"]
    for key, label in (
        ("arrow", "Arrow"),
        ("spark_count", "Spark count()"),
        ("spark_to_arrow", "Spark toArrow() (full materialization)"),
        ("spark_agg_sum", "Spark agg(sum)"),
    ):
        add(
            f"range read of {rr['rows_read']:,} offsets from {rr['queue_rows']:,} rows <= 1 s: {label}",
            rr[key]["latency"]["median_s"],
            TARGETS["range_read_s"],
            "s",
        )
    orr = res["open_read"]
    add(
        f"open+read at {orr['many']['commits']:,} commits <= 1.5x at {orr['few']['commits']}",
        orr["ratio_many_to_few"],
        TARGETS["open_read_ratio"],
        "x",
        f"{orr['many']['median_ms']} ms vs {orr['few']['median_ms']} ms (checkpointed, as delta-rs "
        "does automatically every 100 commits)",
    )
    if "many_maintained" in orr:
        add(
            f"open+read at {orr['many']['commits']:,} commits, maintained (log past retention "
            f"trimmed) <= 1.5x at {orr['few']['commits']}",
            orr["ratio_many_maintained_to_few"],
            TARGETS["open_read_ratio"],
            "x",
            f"{orr['many_maintained']['median_ms']} ms vs {orr['few']['median_ms']} ms",
        )
    return rows


def rerun_part(part: str, lake: Lake, cfg: dict, out_path: Path, root: str, *, keep: bool,
               quick: bool) -> int:
    """Measure one part again and merge it into an existing result file (targets re-evaluated)."""
    doc = json.loads(out_path.read_text())
    try:
        doc["results"][part] = bench_open_read(lake, cfg)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    doc.setdefault("reruns", []).append({"part": part, "at": now_iso(), "machine": machine_info()})
    doc["targets"] = evaluate_targets(doc["results"], quick)
    write_json(out_path, doc)
    for t in doc["targets"]:
        status = "n/a" if t["pass"] is None else ("PASS" if t["pass"] else "FAIL")
        print(f"  [{status:4}] {t['target']}: {t['measured']} {t['unit']} (<= {t['threshold']})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke check")
    parser.add_argument(
        "--out",
        help="JSON output path (default: bench/results/queues.json, "
        "or a file under the temp folder with --quick)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the benchmark lake on disk")
    parser.add_argument("--skip-spark", action="store_true", help="skip the Spark reads")
    parser.add_argument("--only", choices=["open_read"],
                        help="re-measure one part and merge it into the existing JSON")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_path = (
        Path(args.out)
        if args.out
        else (
            Path(tempfile.gettempdir()) / "cues-bench" / "queues-quick.json"
            if args.quick
            else DEFAULT_OUT
        )
    )
    root = tempfile.mkdtemp(prefix="cues-bench-queues-")
    lake = Lake(root=root)
    started = time.perf_counter()
    log(f"{'quick' if args.quick else 'full'} run, lake at {root}")
    results: dict[str, Any] = {}
    if args.only:
        return rerun_part(args.only, lake, cfg, out_path, root, keep=args.keep, quick=args.quick)
    try:
        results["append_throughput"] = bench_append_throughput(lake, cfg)
        small, growth = bench_small_appends(lake, cfg)
        results["small_appends"] = small
        results["commit_latency_vs_table_size"] = growth
        results["commit_latency_vs_table_size_reopened"] = bench_growth_reopened(lake, cfg)
        if not args.skip_spark:
            results["range_read"] = bench_range_read(lake, cfg)
        results["open_read"] = bench_open_read(lake, cfg)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    doc = {
        "benchmark": "queues",
        "mode": "quick" if args.quick else "full",
        "finished_at": now_iso(),
        "duration_s": round(time.perf_counter() - started, 1),
        "machine": machine_info(),
        "config": {
            k: (v if not isinstance(v, dict) else {str(a): b for a, b in v.items()})
            for k, v in cfg.items()
        },
        "targets": evaluate_targets(results, args.quick) if "range_read" in results else [],
        "results": results,
    }
    write_json(out_path, doc)
    log(f"wrote {out_path} ({doc['duration_s']} s)")
    for t in doc["targets"]:
        status = "n/a" if t["pass"] is None else ("PASS" if t["pass"] else "FAIL")
        print(f"  [{status:4}] {t['target']}: {t['measured']} {t['unit']} (<= {t['threshold']})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.exit(main())
