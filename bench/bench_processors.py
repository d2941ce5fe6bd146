"""Processor benchmarks (issue 3): strategies side by side, protocol overhead, recovery, memory.

Run: ``.venv/bin/python bench/bench_processors.py [--quick]`` -> bench/results/processors.json

1. The same graph (map -> join -> fork) under each strategy at 1k / 10k / 100k / 1M messages
   per step; every strategy warmed up once first; strategies interleaved in each round, the
   order rotated every round, so the ratio exactly_once / at_least_once is measured side by side
   (per round); medians over rounds.
2. Fixed per-step overhead of the exactly-once protocol: p50 of the time spent in the backing
   queue records and the commit guard per step (measured with the step hooks), next to the p50
   step time of both strategies at a tiny batch.
3. Recovery time after 10 vs 10,000 backing records.
4. Peak driver (Python process) memory for a 1M-message step.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
CHECKPOINT_EVERY = 100  # delta-rs' default delta.checkpointInterval
from common import machine_info, median, percentile, write_json  # noqa: E402

from cues_platform.processing import (  # noqa: E402
    Graph,
    GraphRunner,
    In,
    Kind,
    Options,
    Out,
    Processor,
    QueueDef,
    Strategy,
)
from cues_platform.processing.backing import (  # noqa: E402
    BackingQueue,
    Range,
    RecordType,
    Snapshot,
)
from cues_platform.processing.runner import create_queues  # noqa: E402
from cues_platform.processing.step import ExactlyOnceStepper  # noqa: E402
from cues_platform.queues import Lake  # noqa: E402
from cues_platform.spark import get_spark  # noqa: E402

ORDERS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("amount", pa.float64())])
META = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("region", pa.int64())])
JOINED = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("amount", pa.float64()),
                    pa.field("region", pa.int64())])


def convert(ctx, orders):
    return orders.select("id", (F.col("amount") * 1.1).alias("amount"))


def enrich(ctx, orders, meta):
    return orders.select("id", "amount").join(meta.select("id", "region"), "id", "inner")


def split(ctx, rows):
    rows = rows.select("id", "amount", "region")
    return {"even": rows.where(F.col("region") % 2 == 0), "odd": rows.where(F.col("region") % 2 == 1)}


def graph(strategy: Strategy, batch: int) -> Graph:
    opts = Options(batch_size=batch, strategy=strategy)
    return Graph.build(name="bench", queues=[
        QueueDef("orders", ORDERS), QueueDef("converted", ORDERS), QueueDef("meta", META),
        QueueDef("joined", JOINED), QueueDef("even", JOINED), QueueDef("odd", JOINED)],
        processors=[
            Processor("convert", Kind.MAP, convert, {"orders": In("orders")}, {"out": Out("converted")}, options=opts),
            Processor("enrich", Kind.JOIN, enrich, {"orders": In("converted"), "meta": In("meta")},
                      {"out": Out("joined")}, options=opts),
            Processor("split", Kind.FORK, split, {"rows": In("joined")},
                      {"even": Out("even"), "odd": Out("odd")}, options=opts),
        ])


def fill(lake: Lake, g: Graph, total: int) -> None:
    create_queues(g, lake)
    chunk = 1_000_000
    for start in range(0, total, chunk):
        n = min(chunk, total - start)
        ids = pa.array(range(start, start + n), pa.int64())
        lake.queue("orders").append(pa.table({"id": ids, "amount": pa.array([1.0] * n)}), partition="0")
        lake.queue("meta").append(pa.table({"id": ids, "region": pa.array([i % 7 for i in range(start, start + n)],
                                                                           pa.int64())}), partition="0")


def run_graph(spark, strategy: Strategy, batch: int, steps: int) -> dict:
    root = tempfile.mkdtemp(prefix="cues-bench-")
    try:
        lake = Lake(root=root)
        g = graph(strategy, batch)
        fill(lake, g, batch * steps)
        runner = GraphRunner(graph=g, lake=lake, spark=spark, keep_results=False)
        runner.recover()
        started = time.perf_counter()
        stats = runner.run_until_idle()
        seconds = time.perf_counter() - started
        out = lake.queue("even").count() + lake.queue("odd").count()
        assert out == batch * steps, (strategy, out)
        return {"seconds": seconds, "messages": batch * steps, "steps": sum(s.steps for s in stats.values()),
                "messages_per_s": batch * steps / seconds}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def strategies_side_by_side(spark, sizes: list[tuple[int, int, int]]) -> list[dict]:
    """Every round runs the three strategies once; the order rotates by one every round, counted
    over all sizes (``turn``), so no strategy is always first, not even in every size's round 0."""
    rows, turn = [], 0
    order = [Strategy.AT_LEAST_ONCE, Strategy.EXACTLY_ONCE, Strategy.AT_MOST_ONCE]
    for batch, steps, rounds in sizes:
        by = {s: [] for s in Strategy}
        orders = []
        for _ in range(rounds):
            rotated = order[turn % 3:] + order[: turn % 3]
            turn += 1
            orders.append([s.value for s in rotated])
            for s in rotated:
                by[s].append(run_graph(spark, s, batch, steps)["messages_per_s"])
        ratios = [eo / alo for eo, alo in zip(by[Strategy.EXACTLY_ONCE], by[Strategy.AT_LEAST_ONCE], strict=True)]
        row = {"messages_per_step": batch, "steps": steps, "rounds": rounds, "orders": orders,
               **{f"{s.value}_msgs_per_s_median": median(v) for s, v in by.items()},
               "exactly_once_over_at_least_once_median": median(ratios), "ratios": ratios}
        print(row, flush=True)
        rows.append(row)
    return rows


def protocol_overhead(spark, steps: int) -> dict:
    """Time inside the protocol's own work: snapshot record, attempt record, commit guard."""
    marks: list[tuple[str, float]] = []
    root = tempfile.mkdtemp(prefix="cues-bench-")
    try:
        lake = Lake(root=root)
        g = graph(Strategy.EXACTLY_ONCE, 100)
        g = Graph.build(name="o", queues=list(g.queues.values()), processors=[g.processors["convert"]])
        fill(lake, g, 100 * steps)
        runner = GraphRunner(graph=g, lake=lake, spark=spark, keep_results=False,
                             hook=lambda p: marks.append((p, time.perf_counter())))
        runner.run_until_idle()
        per_step, step_times = [], []
        current: dict[str, float] = {}
        for point, t in marks:
            current[point] = t
            if point == "after_commit":
                c = current
                # one-commit steps: planning + the home commit (no snapshot or attempt record)
                per_step.append((c["after_snapshot"] - c["before_snapshot"]) + (c["after_commit"] - c["after_prepare"]))
                step_times.append(c["after_commit"] - c["before_snapshot"])
        return {"steps": len(per_step), "backing_records_ms_p50": percentile(per_step, 50) * 1000,
                "backing_records_ms_p99": percentile(per_step, 99) * 1000,
                "step_ms_p50": percentile(step_times, 50) * 1000}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def build_history(lake: Lake, g: Graph, n: int) -> None:
    """``convert`` with ``n`` delivered one-commit steps, as ``n`` steps leave it: its home queue
    ``converted`` holds ``n`` step commits of one row each (app transactions ``proc``, ``pos``,
    ``epoch`` and the snapshot metadata), after a real fence. Steps 0 and n-1 are real
    :func:`commit_step` calls; steps 1..n-2 are written by ``bench_queues.build_commits_fast``
    (same files and log entries as the first, without the per-commit cost that grows with the
    table: 10,000 real commits take most of an hour); the last real commit sets every app
    transaction to step n-1's values, as a real run does. The backing queue holds its epoch
    fence and the digests the stepper writes every ``backing_maintenance_every`` steps (a map's
    steps write no other record), and the home's log is trimmed below them as the stepper trims
    it (:func:`digest_like_the_stepper`)."""
    from bench_queues import build_commits_fast

    from cues_platform.processing.home import commit_step, fence_home
    from cues_platform.queues import maintenance

    epoch = BackingQueue(lake, "convert").fence()
    home = lake.queue("converted")
    assert fence_home(home, "convert", epoch) is None

    def step(i: int) -> None:
        snap = Snapshot("convert", i, {"orders": Range("orders", "0", i * 10, i * 10 + 10)})
        row = pa.table({"id": pa.array([i], pa.int64()), "amount": pa.array([1.0])})
        commit_step(home, snap, {"0": row}, epoch=epoch, outcome=RecordType.ATTEMPT_OUTPUT,
                    rows={"converted": {"0": 1}}, is_record=True)

    step(0)
    if n > 2:
        build_commits_fast(home, n - 1, 1, template_version=home.version())
    # what delta-rs does by itself every 100 commits (only the newest two checkpoints matter)
    if home.version() > CHECKPOINT_EVERY:
        DeltaTable(home.uri, version=home.version() - CHECKPOINT_EVERY).create_checkpoint()
    maintenance.checkpoint(home)
    step(n - 1)
    digest_like_the_stepper(lake, g, home, epoch)


def digest_like_the_stepper(lake: Lake, g: Graph, home, epoch: int) -> None:
    """What ``ExactlyOnceStepper.digest_steps`` did along the way: the home's step commits held
    by its digest queue, then the home's log trimmed below what the digest covers
    (``history.HomeDigests``, ``home.trim_home_log``)."""
    from cues_platform.processing.history import HomeDigests
    from cues_platform.processing.home import trim_home_log

    upto = HomeDigests(lake, home.name).digest(home)
    trim_home_log(home, digested=upto)


def time_recovery(spark, root: str, g: Graph, n: int, runs: int) -> float:
    times = []
    for _ in range(runs):
        fresh = Lake(root=root)  # a new process's view: nothing cached
        t = time.perf_counter()
        stepper = ExactlyOnceStepper(graph=g, processor=g.processors["convert"], lake=fresh, spark=spark)
        stepper.recover()
        assert stepper.positions == {"orders": n * 10}, stepper.positions
        times.append(time.perf_counter() - t)
        assert stepper.next_step == n, (stepper.next_step, n)
    return median(times)


def recovery_time(spark, histories: list[int], runs: int) -> dict:
    """Recovery (open the backing queue, fence, read the last record) after ``n`` steps, as left
    by the steps (one file per record, checkpointed), and after ``maintain`` (compact, checkpoint,
    vacuum) as a maintained deployment keeps it."""
    from cues_platform.queues import maintenance

    out: dict = {}
    for n in histories:
        root = tempfile.mkdtemp(prefix="cues-bench-")
        try:
            lake = Lake(root=root)
            g = graph(Strategy.EXACTLY_ONCE, 10)
            create_queues(g, lake)
            t = time.perf_counter()
            build_history(lake, g, n)
            build_s = time.perf_counter() - t
            raw = time_recovery(spark, root, g, n, runs)
            # A deployment's history is mostly older than the backing queue's log and tombstone
            # retention (BACKING_RETENTION, 1 hour); this fresh one is seconds old, so emulate
            # its age by setting both retentions to 0 before the maintenance the stepper runs.
            aged = Lake(root=root).queue("converted")  # the home queue: where recovery reads
            aged.refresh().alter.set_table_properties(
                {"delta.logRetentionDuration": "interval 0 hours",
                 "delta.deletedFileRetentionDuration": "interval 0 hours"})
            maintenance.maintain(aged, retention_hours=0, unsafe_allow_short_retention=True)
            maintained = time_recovery(spark, root, g, n, runs)
            out[str(n)] = {"records": n, "recover_s_median": raw, "recover_maintained_s_median": maintained,
                           "runs": runs, "build_s": build_s}
            print(n, out[str(n)], flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    first, last = str(histories[0]), str(histories[-1])
    out["ratio_large_over_small"] = out[last]["recover_s_median"] / out[first]["recover_s_median"]
    out["ratio_large_over_small_maintained"] = (out[last]["recover_maintained_s_median"]
                                                / out[first]["recover_maintained_s_median"])
    return out


def _checkpoint_tombstones(uri: str) -> int:
    """Remove actions (tombstones) in the newest checkpoint of the table at ``uri``."""
    import pyarrow.parquet as pq

    log = Path(uri.removeprefix("file://")) / "_delta_log"
    newest = max(log.glob("*.checkpoint.parquet"))
    return sum(1 for r in pq.read_table(newest, columns=["remove"]).column("remove").to_pylist() if r)


def recovery_at_tombstone_retention(spark, histories: list[int], rounds: int, runs: int) -> dict:
    """Recovery after ``n`` steps with the home queue at the queue tombstone retention
    (``maintenance.QUEUE_TOMBSTONE_PROPERTY``, 24 h, set on the home as ``Lake.create_queue``
    sets it), maintained as ``cues queue maintain`` does (compaction, checkpoint, vacuum at the
    default 24 h), in two ages:

    - ``fresh``: the maintenance checkpoint is written right after the compaction, so delta-rs'
      checkpoint keeps every compacted step's tombstone (a processor that steps more than ``n``
      times a day); on a local lake ``maintenance.checkpoint`` then writes one more without them
      (``checkpoint_without_tombstones``), so both ages now report 0 tombstones there;
    - ``aged``: the checkpoint is written more than the tombstone retention after the
      compaction, so it drops them. Emulated: the retention is set to 0 hours for that one
      checkpoint and back to 24 h (delta-rs takes its clock from the system; a checkpoint keeps
      a tombstone while ``now - deletionTimestamp`` is below the retention).

    Every history is built once; each round times every (n, age) once, the order rotated by one
    every round; medians of ``runs`` recoveries per round, then medians over rounds."""
    import gc

    from cues_platform.queues import maintenance

    ages = ("fresh", "aged")
    cases = [(n, age) for n in histories for age in ages]
    roots: dict[tuple[int, str], str] = {}
    graphs: dict[tuple[int, str], Graph] = {}
    out: dict = {"tombstone_retention": maintenance.QUEUE_TOMBSTONE_RETENTION,
                 "vacuum_retention_hours": maintenance.DEFAULT_VACUUM_RETENTION_HOURS,
                 "rounds": rounds, "runs_per_round": runs, "cases": {}}
    try:
        for n, age in cases:
            root = tempfile.mkdtemp(prefix="cues-bench-")
            roots[(n, age)] = root
            lake = Lake(root=root)
            g = graphs[(n, age)] = graph(Strategy.EXACTLY_ONCE, 10)
            create_queues(g, lake)
            lake.queue("converted").refresh().alter.set_table_properties(maintenance.QUEUE_TOMBSTONE_PROPERTY)
            build_history(lake, g, n)
            home = Lake(root=root).queue("converted")
            maintenance.compact(home)
            if age == "aged":
                home.refresh().alter.set_table_properties({"delta.deletedFileRetentionDuration": "interval 0 hours"})
                maintenance.checkpoint(home)
                home.refresh().alter.set_table_properties(maintenance.QUEUE_TOMBSTONE_PROPERTY)
            maintenance.maintain(Lake(root=root).queue("converted"))
            props = DeltaTable(home.uri).metadata().configuration
            assert props["delta.deletedFileRetentionDuration"] == maintenance.QUEUE_TOMBSTONE_RETENTION, props
            out["cases"][f"{n}_{age}"] = {"steps": n, "age": age,
                                          "home_checkpoint_tombstones": _checkpoint_tombstones(home.uri),
                                          "per_round_medians_s": [], "orders": []}
            print(n, age, out["cases"][f"{n}_{age}"]["home_checkpoint_tombstones"], "tombstones", flush=True)
        for r in range(rounds):
            order = cases[r % len(cases):] + cases[: r % len(cases)]
            for n, age in order:
                gc.collect()
                jvm = getattr(spark, "_jvm", None)
                if jvm is not None:
                    jvm.System.gc()
                case = out["cases"][f"{n}_{age}"]
                case["per_round_medians_s"].append(time_recovery(spark, roots[(n, age)], graphs[(n, age)], n, runs))
                case["orders"].append(r)
            print("round", r, [f"{n}_{age}" for n, age in order], flush=True)
    finally:
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)
    small, large = histories[0], histories[-1]
    for age in ages:
        a = out["cases"][f"{small}_{age}"]["per_round_medians_s"]
        b = out["cases"][f"{large}_{age}"]["per_round_medians_s"]
        out[f"ratio_{large}_over_{small}_{age}_per_round"] = [y / x for x, y in zip(a, b, strict=True)]
        out[f"ratio_{large}_over_{small}_{age}_median"] = median(out[f"ratio_{large}_over_{small}_{age}_per_round"])
        for key in (f"{small}_{age}", f"{large}_{age}"):
            out["cases"][key]["recover_s_median"] = median(out["cases"][key]["per_round_medians_s"])
    return out


def peak_memory(spark, batch: int) -> dict:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run_graph(spark, Strategy.EXACTLY_ONCE, batch, 1)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"messages_per_step": batch, "driver_peak_rss_mib": after / 1024,
            "driver_peak_rss_growth_mib": (after - before) / 1024, "seconds": result["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["recovery", "recovery-tombstones"],
                        help="re-measure one part; merged into the JSON (recovery-tombstones: its own "
                             "JSON, bench/results/recovery_tombstones.json)")
    parser.add_argument("--rounds", type=int, default=5, help="recovery-tombstones: rounds")
    args = parser.parse_args()
    spark = get_spark()
    if args.only == "recovery-tombstones":
        histories = [10, 200] if args.quick else [10, 10_000]
        results = recovery_at_tombstone_retention(spark, histories, args.rounds, 5)
        results["machine"] = machine_info()
        name = "recovery_tombstones-quick.json" if args.quick else "recovery_tombstones.json"
        print("wrote", write_json(Path(__file__).parent / "results" / name, results))
        return
    out_path = Path(__file__).parent / "results" / ("processors-quick.json" if args.quick else "processors.json")
    if args.only == "recovery":
        import json

        results = json.loads(out_path.read_text())
        results["recovery"] = recovery_time(spark, [10, 200] if args.quick else [10, 1_000, 10_000], 7)
        results["recovery"]["machine"] = machine_info()
        print("wrote", write_json(out_path, results))
        return
    for strategy in Strategy:  # warm-up of every contender (JIT, first jobs, its own code paths)
        run_graph(spark, strategy, 1000, 2)
    if args.quick:
        sizes, overhead_steps, histories, mem = [(1000, 3, 1), (10_000, 2, 1)], 10, [10, 200], 10_000
    else:
        sizes = [(1000, 8, 3), (10_000, 5, 3), (100_000, 3, 3), (1_000_000, 1, 3)]
        overhead_steps, histories, mem = 40, [10, 1_000, 10_000], 1_000_000
    results = {
        "machine": machine_info(),
        "strategies": strategies_side_by_side(spark, sizes),
        "protocol_overhead": protocol_overhead(spark, overhead_steps),
        "recovery": recovery_time(spark, histories, 7),
        "memory": peak_memory(spark, mem),
        "quick": args.quick,
    }
    path = write_json(out_path, results)
    print("wrote", path)


if __name__ == "__main__":
    main()
