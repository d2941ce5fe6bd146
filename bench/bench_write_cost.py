"""What the per-row metadata columns cost Spark's Parquet writer, and what a 1M backlog step written by the executors would take without them (issue 26).

Run: ``.venv/bin/python bench/bench_write_cost.py [--rows 1000000] [--rounds 5]`` ->
bench/results/write_cost.json (a smoke run: ``--rows 100000 --rounds 1 --out /tmp/write-cost-smoke.json``).

The workload is ``bench/bench_peers.py``'s (its data, its ``price`` transform, its harness:
one Spark session, every contender warmed up, rounds with the order rotated, medians, ratios per
round). The contenders are plain Spark jobs over the same 10 input files, differing only in
what they write, plus three whole runs of bench_peers for reference:

- ``spark_noop``: ``price`` into the ``noop`` sink (the Spark work alone, nothing written);
- ``spark_batch``: ``price`` written as Parquet (bench_peers' plain batch);
- ``spark_batch_offset``: the same plus ``_offset`` = the row's index in its task's file, the
  one metadata column a file with based offsets must carry per row (``queues/based.py``);
- ``spark_batch_nulls``: plus the three metadata columns that are null in every row a step's
  executors write (``_producer_id``, ``_producer_seq``, ``_txn_id``);
- ``spark_batch_constants``: plus, instead, the three that are one value per step
  (``_delivery_hash``, ``_message_type``, ``_append_time``);
- ``spark_batch_metadata``: plus all seven, exactly the columns ``executor_output.write_based``
  writes today (its own ``_metadata_columns``), one file per task;
- ``spark_to_arrow``: ``price`` collected to the driver as Arrow (the driver path's Spark job);
- ``range_literal`` and ``range_step_constant``: the input queue read the way a step reads it
  (``Queue.read_spark``) over a range that starts inside its first file (a new start every run,
  as every step has), priced and collected as Arrow: with the offset bounds as literals (the
  product before ``spark_values.py``; forced here by patching ``ReadPlan.pruning_pays``) and as
  the product reads them now (bounds as data: the stage compiled once);
- ``spark_streaming_available_now``, ``cues_exactly_once_default`` (the product's default
  step, driver write, absolute queue), ``cues_exactly_once_default_based`` (the same into a
  based queue, still the driver's write) and ``cues_default_executors_based`` (the same backlog
  step written by the executors in one job into a based queue: ``OutputWriter.EXECUTORS``).

Derived per round (``derived`` in the JSON): the metadata's cost in Spark's writer
(``spark_batch_metadata - spark_batch_offset``) and the step it leaves if a based file carried
only ``_offset`` per row and its per-step values once per file
(``cues_default_executors_based`` minus that cost), as throughput ratios against plain batch
and ``availableNow``. An estimate, labelled as one: no such file format exists yet.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_peers as peers
from common import machine_info, median, now_iso, write_json

from cues_platform.processing import OutputWriter, Strategy
from cues_platform.processing.executor_output import _metadata_columns
from cues_platform.queues import OffsetLayout

HERE = Path(__file__).resolve().parent
# which of _metadata_columns' seven columns each contender adds (their order there:
# _offset, _producer_id, _producer_seq, _delivery_hash, _message_type, _append_time, _txn_id)
COLUMN_SETS = {"spark_batch_offset": [0], "spark_batch_nulls": [0, 1, 2, 6],
               "spark_batch_constants": [0, 3, 4, 5], "spark_batch_metadata": [0, 1, 2, 3, 4, 5, 6]}


def _frame(spark: Any, data: peers.Data, fx: Any) -> Any:
    return peers.price(spark.read.schema(peers._spark_schema(peers.POSTINGS)).parquet(str(data.files)), fx)


def run_spark_write(columns: list[int] | None, *, sink: str = "parquet") -> Any:
    """``price`` plus the metadata columns at ``columns`` (None: none), written to ``sink``."""
    def run(spark: Any, data: peers.Data, fx: Any, jobs: peers.Jobs, work: Path) -> peers.Run:
        from pyspark.sql import functions as F

        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        group = jobs.group(f"write-cost-{sink}")
        t = time.perf_counter()
        frame = _frame(spark, data, fx)
        if columns is not None:
            index = F.monotonically_increasing_id() - F.shiftleft(F.spark_partition_id().cast("long"), 33)
            meta = _metadata_columns(index, "0" * 64, "message")
            frame = frame.select("*", *[meta[i] for i in columns])
        writer = frame.write.mode("overwrite")
        if sink == "noop":
            writer.format("noop").save()
        else:  # one file per task, as write_based writes
            writer.option("maxRecordsPerFile", 0).parquet(str(work / "out"))
        seconds = time.perf_counter() - t
        jobs.clear()
        if sink != "noop":
            peers._check_rows(spark.read.parquet(str(work / "out")).count(), data.rows, "write_cost")
        return peers.Run(seconds, jobs.count(group), 1, [jobs.count(group)], [seconds])

    return run


def run_to_arrow(spark: Any, data: peers.Data, fx: Any, jobs: peers.Jobs, work: Path) -> peers.Run:
    group = jobs.group("write-cost-to-arrow")
    t = time.perf_counter()
    rows = _frame(spark, data, fx).toArrow().num_rows
    seconds = time.perf_counter() - t
    jobs.clear()
    peers._check_rows(rows, data.rows, "spark_to_arrow")
    return peers.Run(seconds, jobs.count(group), 1, [jobs.count(group)], [seconds])


_RUNS = [0]


def run_range(*, literal: bool) -> Any:
    def run(spark: Any, data: peers.Data, fx: Any, jobs: peers.Jobs, work: Path) -> peers.Run:
        from cues_platform.queues import Lake
        from cues_platform.queues.reader import ReadPlan

        _RUNS[0] += 1
        start = 1 + _RUNS[0] % 997  # inside the first file: the offset filter stays
        queue = Lake(root=str(data.lake)).queue("postings")
        group = jobs.group(f"write-cost-range-{literal}")
        saved = ReadPlan.pruning_pays
        try:
            if literal:
                ReadPlan.pruning_pays = property(lambda plan: True)  # type: ignore[method-assign]
            t = time.perf_counter()
            frame = queue.read_spark(spark, partition="0", start=start, end=data.rows)
            rows = peers.price(frame, fx).toArrow().num_rows
            seconds = time.perf_counter() - t
        finally:
            ReadPlan.pruning_pays = saved  # type: ignore[method-assign]
        jobs.clear()
        peers._check_rows(rows, data.rows - start, "range read")
        return peers.Run(seconds, jobs.count(group), 1, [jobs.count(group)], [seconds])

    return run


CONTENDERS = {
    "spark_noop": run_spark_write(None, sink="noop"),
    "spark_batch": peers.run_spark_batch,
    **{name: run_spark_write(cols) for name, cols in COLUMN_SETS.items()},
    "spark_to_arrow": run_to_arrow,
    "range_literal": run_range(literal=True),
    "range_step_constant": run_range(literal=False),
    "spark_streaming_available_now": peers.CONTENDERS["spark_streaming_available_now"],
    "cues_exactly_once_default": peers.CONTENDERS["cues_exactly_once_default"],
    "cues_exactly_once_default_based": peers.CONTENDERS["cues_exactly_once_default_based"],
    "cues_default_executors_based": peers.run_cues(Strategy.EXACTLY_ONCE, default_options=True,
                                                   writer=OutputWriter.EXECUTORS,
                                                   layout=OffsetLayout.BASED),
}


def derived(runs: dict[str, list[peers.Run]]) -> dict:
    """Per round (both sides of each difference and ratio from the same round)."""
    s = {name: [r.seconds for r in rs] for name, rs in runs.items()}
    out = {}
    if {"range_literal", "range_step_constant"} <= set(s):
        out["range_step_constant_vs_literal (throughput)"] = _per_round(
            [a / b for a, b in zip(s["range_literal"], s["range_step_constant"], strict=True)])
    needed = {"spark_batch", "spark_batch_metadata", "spark_batch_offset", "cues_default_executors_based",
              "spark_streaming_available_now", "cues_exactly_once_default"}
    if {"cues_exactly_once_default_based", "cues_default_executors_based"} <= set(s):
        out["executors_vs_driver_on_a_based_queue (throughput)"] = _per_round(
            [a / b for a, b in zip(s["cues_exactly_once_default_based"], s["cues_default_executors_based"],
                                   strict=True)])
    if not needed <= set(s):
        return out
    rounds = range(len(runs["spark_batch"]))
    cost = [s["spark_batch_metadata"][i] - s["spark_batch_offset"][i] for i in rounds]
    lean = [s["cues_default_executors_based"][i] - cost[i] for i in rounds]

    per_round = _per_round
    return {
        **out,
        "metadata_cost_s (spark_batch_metadata - spark_batch_offset)": per_round(cost),
        "metadata_cost_vs_batch (that cost / spark_batch)": per_round(
            [cost[i] / s["spark_batch"][i] for i in rounds]),
        "lean_step_estimate_s (cues_default_executors_based - metadata cost)": per_round(lean),
        "lean_estimate_vs_batch (throughput: spark_batch / estimate)": per_round(
            [s["spark_batch"][i] / lean[i] for i in rounds]),
        "lean_estimate_vs_available_now (throughput)": per_round(
            [s["spark_streaming_available_now"][i] / lean[i] for i in rounds]),
        "default_vs_batch (throughput, as bench_peers' target)": per_round(
            [s["spark_batch"][i] / s["cues_exactly_once_default"][i] for i in rounds]),
        "default_vs_available_now (throughput, as bench_peers' target)": per_round(
            [s["spark_streaming_available_now"][i] / s["cues_exactly_once_default"][i] for i in rounds]),
        "executors_based_vs_batch (throughput)": per_round(
            [s["spark_batch"][i] / s["cues_default_executors_based"][i] for i in rounds]),
    }


def _per_round(xs: list[float]) -> dict:
    return {"per_round": [round(x, 4) for x in xs], "median": round(median(xs), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "write_cost.json")
    parser.add_argument("--note", default="")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset")
    args = parser.parse_args()
    if args.rows % peers.CHUNKS or args.rows < peers.CHUNKS:
        parser.error(f"--rows must be a positive multiple of {peers.CHUNKS}")
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    if unknown := sorted(set(names) - set(CONTENDERS)):
        parser.error(f"unknown contenders {unknown}; choose from {sorted(CONTENDERS)}")
    peers.CONTENDERS.update(CONTENDERS)  # side_by_side runs contenders by name from there
    from cues_platform.spark import get_spark

    spark = get_spark()
    root = Path(tempfile.mkdtemp(prefix="cues-write-cost-"))
    started, load_start = now_iso(), round(os.getloadavg()[0], 1)
    try:
        data = peers.generate(root, args.rows, 10)
        side, runs = peers.side_by_side(spark, data, args.rounds, names)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {"benchmark": "write_cost", "at": started, "machine": machine_info(), "note": args.note,
              "config": {"rows": args.rows, "rounds": args.rounds, "master": spark.sparkContext.master},
              "load_average_1m": {"start": load_start, "end": round(os.getloadavg()[0], 1)},
              "side_by_side": side, "derived": derived(runs)}
    for name, c in side["contenders"].items():
        print(f"{name:32} {c['median_s']:.3f} s")
    for name, d in result["derived"].items():
        print(f"{name:70} {d['median']}")
    print("wrote", write_json(args.out, result))


if __name__ == "__main__":
    main()
