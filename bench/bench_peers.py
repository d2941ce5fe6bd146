"""Peer benchmark (issues 11 and 26): cues processors side by side with plain Spark and Structured Streaming.

Run: ``.venv/bin/python bench/bench_peers.py [--rows 1000000] [--rounds 3]`` -> bench/results/peers.json
(a smoke run that proves the code, numbers meaningless: ``--quick`` -> /tmp/peers-quick.json: 200,000
rows, 1 round, 10 protocol steps, recovery 10 vs 200 steps).

The workload: ``--rows`` generated postings (id, sender, receiver, currency, amount, account),
priced with an fx table of 6 currencies (a broadcast left join) and decided by status rules
(no rate -> REJECTED bad_currency; account % 97 == 0 -> REJECTED unknown_account; settlement
amount > 9,000 -> REJECTED insufficient_funds; else OK). Every contender runs the same
:func:`price` on the same data, in ONE Spark session (``local[*]``), but one: the Arrow small
steps run :func:`price_arrow`, checked to give the same rows:

- ``spark_batch``: ``spark.read.parquet`` of the 10 input files -> price -> ``write.parquet``
  (no delivery guarantee);
- ``spark_streaming``: Structured Streaming file source (``maxFilesPerTrigger=1`` over the 10
  files) -> price -> the exactly-once file sink, ``trigger(availableNow=True)``: 10 micro-batches;
- ``spark_streaming_available_now``: the same query without a per-trigger limit: the backlog in
  ONE micro-batch (the backlog target's Structured Streaming side);
- ``spark_streaming_small`` / ``cues_exactly_once_small``: the small-step workload, ``SMALL_STEPS``
  (20) chunks of ``--small-rows`` (1,000) postings: 20 micro-batches (``maxFilesPerTrigger=1``)
  against 20 fixed-size exactly_once steps (``batch_size = max_batch_size = 1,000``); per step,
  Structured Streaming's own ``durationMs.triggerExecution`` against the step's
  ``before_snapshot -> after_commit`` (step hooks);
- ``cues_exactly_once_small_arrow``: the same 20 small steps reading their input as Arrow
  (``Options.read_as = ReadAs.ARROW``) with :func:`price_arrow`, the transform in pyarrow (its
  output is checked equal to :func:`price`'s, every column, or the run is invalid): the small-step
  target is taken on it, the Spark-function steps reported beside it;
- ``cues_exactly_once`` / ``cues_at_least_once`` / ``cues_at_most_once``: one MAP processor,
  ``batch_size = rows / 10`` (10 steps), input queue filled with the same 10 chunks;
- ``cues_exactly_once_default``: the same MAP with default ``Options`` (the backlog target);
  ``cues_exactly_once_default_based``: the same into a queue with based offsets;
- ``cues_exactly_once_executors``: the 10 steps with ``OutputWriter.EXECUTORS`` into a queue
  with based offsets (Spark writes the output files in ONE job, the commit assigns their
  offsets: ``queues/based.py``). The other cues contenders use the default
  ``OutputWriter.AUTO``, which writes steps of up to 1M input rows on the driver.

Every cues contender writes to the queue ``priced`` (absolute offsets, the default layout),
except the two based ones (``priced_based``). The input queue ``postings`` is filled by driver
appends.

Every contender is warmed up once (untimed), then ``--rounds`` rounds run every contender once,
the order rotated by one each round (no contender is always first). Times are medians; ratios are
taken per round (both sides of a ratio saw the same machine state) and their median is what the
targets compare. Spark jobs are counted with job groups (``SparkContext.setJobGroup`` and the
status tracker): per run, and for cues per step (a new group at each step's ``before_snapshot``).

Targets (issue 26) are computed under ``targets`` (PASS/FAIL/NOT MEASURED); figures without a bound
(Spark jobs per step) under ``reported``. Two targets are measured by other benchmarks and only
read here, with the file, its time and git commit: the paced-postings p99
(``bench_participants.py`` -> ``participants.json``) and the driver's peak memory of a 10M-row
backlog with the default writer (``bench_driver_memory.py`` -> ``driver_memory.json``).

Separately in the same run: the protocol's own work per step (exactly_once, tiny steps, measured
with the step hooks) next to one small delta-rs commit timed after each step's commit (the two
sides interleaved, step by step); recovery after 10 and after ``--recovery-steps`` one-commit
steps, the home queue maintained as a deployment maintains it (the default retention, not forced
to 0), both histories built first, then timed side by side: 15 rounds of one recovery each, the
order rotated (until 2026-11-29 each side was timed in a block of its own, one after the other,
which moved these two ratios by up to 0.4 between runs of the same code). The paced-postings latency (p99) is measured by
``bench/bench_participants.py``; this script reads it from that benchmark's JSON (``--postings-json``)
and records where it came from.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from common import machine_info, median, now_iso, percentile, write_json  # noqa: E402

from cues_platform.processing import (  # noqa: E402
    Graph,
    GraphRunner,
    In,
    Kind,
    Options,
    Out,
    OutputWriter,
    Processor,
    QueueDef,
    ReadAs,
    Strategy,
)
from cues_platform.processing.runner import create_queues  # noqa: E402
from cues_platform.queues import Lake, OffsetLayout  # noqa: E402

# The output queue of the cues contenders: "priced" with absolute offsets (the default layout),
# "priced_based" with based ones (the executors' one-job write, queues/based.py)
OUTPUT = {OffsetLayout.ABSOLUTE: "priced", OffsetLayout.BASED: "priced_based"}

CHUNKS = 10  # input files / micro-batches / cues steps
SMALL_STEPS = 20  # the small-step workload: this many chunks of --small-rows (issue 26)
CURRENCIES = ["EUR", "USD", "GBP", "CHF", "SEK", "JPY", "XXX"]  # XXX has no rate
RATES = {"EUR": 1.0, "USD": 0.92, "GBP": 1.17, "CHF": 1.06, "SEK": 0.087, "JPY": 0.0061}
SENDERS = ["bank-a", "bank-b", "bank-c", "bank-d"]

POSTINGS = pa.schema([
    pa.field("id", pa.int64()), pa.field("sender", pa.string()), pa.field("receiver", pa.string()),
    pa.field("currency", pa.string()), pa.field("amount", pa.float64()), pa.field("account", pa.int64()),
])
PRICED = pa.schema([
    pa.field("id", pa.int64()), pa.field("sender", pa.string()), pa.field("receiver", pa.string()),
    pa.field("currency", pa.string()), pa.field("amount", pa.float64()),
    pa.field("rate", pa.float64()), pa.field("settlement_amount", pa.float64()),
    pa.field("status", pa.string()), pa.field("reason", pa.string()),
])
FX = pa.schema([pa.field("currency", pa.string()), pa.field("rate", pa.float64())])


def price(postings: Any, fx: Any) -> Any:
    """The workload: fx broadcast join + status rules (the same for every contender)."""
    from pyspark.sql import functions as F

    joined = postings.join(F.broadcast(fx), on="currency", how="left")
    settlement = F.round(F.col("amount") * F.col("rate"), 2)
    reason = (F.when(F.col("rate").isNull(), F.lit("bad_currency"))
              .when(F.col("account") % 97 == 0, F.lit("unknown_account"))
              .when(settlement > 9_000, F.lit("insufficient_funds")))
    return joined.select(
        "id", "sender", "receiver", "currency", "amount", "rate",
        settlement.alias("settlement_amount"),
        F.when(reason.isNull(), F.lit("OK")).otherwise(F.lit("REJECTED")).alias("status"),
        reason.alias("reason"))


CENT = Decimal("0.01")


def price_arrow(postings: pa.Table, fx: pa.Table) -> pa.Table:
    """:func:`price` written on Arrow (pyarrow compute), for steps that read their input as Arrow
    (``ReadAs.ARROW``); rows sorted by id. The benchmark checks its output equals :func:`price`'s
    on the same rows (``check_small_output``)."""
    joined = postings.join(fx, keys="currency", join_type="left outer").sort_by("id")
    # Spark's round(double, 2) rounds the double's decimal string HALF_UP (Scala BigDecimal(d));
    # pyarrow's round works on x * 100 in floating point and differs at ties: Decimal, as Spark
    product = pc.multiply(joined["amount"], joined["rate"]).to_pylist()
    settlement = pa.array([None if x is None else float(Decimal(repr(x)).quantize(CENT, ROUND_HALF_UP))
                           for x in product], pa.float64())
    account = joined["account"]
    unknown = pc.equal(pc.subtract(account, pc.multiply(pc.divide(account, 97), 97)), 0)
    no_rate = pc.is_null(joined["rate"])
    reason = pc.if_else(no_rate, "bad_currency",
                        pc.if_else(unknown, "unknown_account",
                                   pc.if_else(pc.greater(settlement, 9_000), "insufficient_funds",
                                              pa.scalar(None, pa.string()))))
    status = pc.if_else(pc.is_null(reason), "OK", "REJECTED")
    return pa.table([joined["id"], joined["sender"], joined["receiver"], joined["currency"],
                     joined["amount"], joined["rate"], settlement, status, reason], schema=PRICED)


# -- data ------------------------------------------------------------------------------------------
def chunk(start: int, n: int, rng: np.random.Generator) -> pa.Table:
    senders = np.array(SENDERS)
    return pa.table({
        "id": np.arange(start, start + n, dtype=np.int64),
        "sender": senders[rng.integers(0, len(SENDERS), n)],
        "receiver": senders[rng.integers(0, len(SENDERS), n)],
        "currency": np.array(CURRENCIES)[rng.integers(0, len(CURRENCIES), n)],
        "amount": np.round(rng.uniform(1, 10_000, n), 2),
        "account": rng.integers(0, 1_000_000, n, dtype=np.int64),
    }, schema=POSTINGS)


@dataclass
class Data:
    root: Path
    rows: int
    files: Path  # CHUNKS parquet files (Spark contenders)
    fx: Path  # one parquet file
    lake: Path  # template lake: queue "postings" holding the CHUNKS chunks (cues contenders)
    small_rows: int  # rows per small step
    small_files: Path  # SMALL_STEPS parquet files of small_rows
    small_lake: Path  # template lake holding the same SMALL_STEPS chunks


def generate(root: Path, rows: int, small_rows: int) -> Data:
    rng = np.random.default_rng(11)
    data = Data(root, rows, root / "input", root / "fx.parquet", root / "lake-template",
                small_rows, root / "input-small", root / "lake-template-small")
    data.files.mkdir(parents=True)
    data.small_files.mkdir(parents=True)
    pq.write_table(pa.table({"currency": list(RATES), "rate": list(RATES.values())}, schema=FX), data.fx)
    lake = Lake(root=str(data.lake))
    create_queues(cues_graph(Strategy.EXACTLY_ONCE, rows // CHUNKS, fx=None), lake)
    queue = lake.queue("postings")
    size = rows // CHUNKS
    for i in range(CHUNKS):
        t = chunk(i * size, size, rng)
        pq.write_table(t, data.files / f"part-{i:03d}.parquet")
        queue.append(t, partition="0")
    small = Lake(root=str(data.small_lake))
    create_queues(cues_graph(Strategy.EXACTLY_ONCE, small_rows, fx=None), small)
    small_queue = small.queue("postings")
    for i in range(SMALL_STEPS):
        t = chunk(rows + i * small_rows, small_rows, rng)
        pq.write_table(t, data.small_files / f"part-{i:03d}.parquet")
        small_queue.append(t, partition="0")
    return data


# -- job counting ----------------------------------------------------------------------------------
class Jobs:
    """Spark jobs per job group (``setJobGroup`` is thread-local: steps run on this thread)."""

    def __init__(self, spark: Any) -> None:
        self.sc = spark.sparkContext
        self.seq = 0

    def group(self, tag: str) -> str:
        self.seq += 1
        name = f"peers-{self.seq}-{tag}"
        self.sc.setJobGroup(name, tag)
        return name

    def count(self, name: str) -> int:
        return len(self.sc.statusTracker().getJobIdsForGroup(name))

    def clear(self) -> None:
        self.sc.setJobGroup("peers-idle", "outside a measured run")


# -- contenders ------------------------------------------------------------------------------------
def cues_graph(strategy: Strategy, batch: int | None, *, fx: Any,
               writer: OutputWriter = OutputWriter.AUTO, read_as: ReadAs = ReadAs.SPARK,
               layout: OffsetLayout = OffsetLayout.ABSOLUTE) -> Graph:
    def fn(ctx: Any, postings: Any) -> Any:
        return price(postings, fx)

    def fn_arrow(ctx: Any, postings: pa.Table) -> pa.Table:
        return price_arrow(postings, fx)

    # fixed-size steps for the 10-step contenders (no backlog steps); defaults for the backlog one
    opts = (Options(strategy=strategy, output_writer=writer) if batch is None
            else Options(batch_size=batch, max_batch_size=batch, strategy=strategy, output_writer=writer,
                         read_as=read_as))
    fn = fn_arrow if read_as is ReadAs.ARROW else fn
    queues = [QueueDef("postings", POSTINGS),
              *[QueueDef(name, PRICED, offset_layout=lay) for lay, name in OUTPUT.items()]]
    return Graph.build(name="peers", queues=queues,
                       processors=[Processor("price", Kind.MAP, fn, {"postings": In("postings")},
                                             {"out": Out(OUTPUT[layout])}, options=opts)])


@dataclass
class Run:
    seconds: float
    jobs: int
    steps: int
    jobs_per_step: list[int]
    # per step (cues: before_snapshot -> after_commit) / per micro-batch (Structured Streaming:
    # its own durationMs.triggerExecution), seconds
    step_seconds: list[float]


def run_spark_batch(spark: Any, data: Data, fx: Any, jobs: Jobs, work: Path) -> Run:
    out = work / "out"
    group = jobs.group("spark_batch")
    t = time.perf_counter()
    frame = spark.read.schema(_spark_schema(POSTINGS)).parquet(str(data.files))
    price(frame, fx).write.mode("overwrite").parquet(str(out))
    seconds = time.perf_counter() - t
    jobs.clear()
    _check_rows(spark.read.parquet(str(out)).count(), data.rows, "spark_batch")
    return Run(seconds, jobs.count(group), 1, [jobs.count(group)], [seconds])


def run_spark_streaming(*, one_file_per_trigger: bool = True, small: bool = False) -> Callable[..., Run]:
    """``maxFilesPerTrigger=1`` (one micro-batch per input file) or no per-trigger limit (the
    whole backlog in one micro-batch); ``small``: the small-step files."""
    label = "spark_streaming" + ("_small" if small else "" if one_file_per_trigger else "_available_now")

    def run(spark: Any, data: Data, fx: Any, jobs: Jobs, work: Path) -> Run:
        out, checkpoint = work / "out", work / "checkpoint"
        files, rows = (data.small_files, data.small_rows * SMALL_STEPS) if small else (data.files, data.rows)
        group = jobs.group(label)
        t = time.perf_counter()
        reader = spark.readStream.schema(_spark_schema(POSTINGS))
        if one_file_per_trigger:
            reader = reader.option("maxFilesPerTrigger", 1)
        query = (price(reader.parquet(str(files)), fx).writeStream.format("parquet")
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start(str(out)))
        query.awaitTermination()
        seconds = time.perf_counter() - t
        jobs.clear()
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        _check_rows(spark.read.parquet(str(out)).count(), rows, label)
        # The micro-batches run on the query's own thread, under the job group Spark sets there
        # (StreamExecution: the query's runId), not ours.
        total = jobs.count(str(query.runId)) + jobs.count(group)
        per_batch = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
        return Run(seconds, total, len(progress), [], per_batch)

    return run


def run_cues(strategy: Strategy, *, default_options: bool = False,
             writer: OutputWriter = OutputWriter.AUTO, small: bool = False,
             read_as: ReadAs = ReadAs.SPARK, layout: OffsetLayout = OffsetLayout.ABSOLUTE) -> Callable[..., Run]:
    def run(spark: Any, data: Data, fx: Any, jobs: Jobs, work: Path) -> Run:
        if read_as is ReadAs.ARROW:
            fx = pq.read_table(data.fx)
        root = work / "lake"
        shutil.copytree(data.small_lake if small else data.lake, root)
        lake = Lake(root=str(root))
        batch = None if default_options else data.small_rows if small else data.rows // CHUNKS
        rows = data.small_rows * SMALL_STEPS if small else data.rows
        graph = cues_graph(strategy, batch, fx=fx, writer=writer, read_as=read_as, layout=layout)
        groups: list[str] = []
        done: list[str] = []
        started: list[float] = []
        step_seconds: list[float] = []

        def hook(point: str) -> None:
            if point == "before_snapshot":
                groups.append(jobs.group(f"cues-{strategy.value}-step"))
                started.append(time.perf_counter())
            elif point == "after_commit":
                step_seconds.append(time.perf_counter() - started[-1])
                done.append(groups[-1])

        t = time.perf_counter()
        runner = GraphRunner(graph=graph, lake=lake, spark=spark, hook=hook, keep_results=False)
        runner.recover()
        stats = runner.run_until_idle()
        seconds = time.perf_counter() - t
        jobs.clear()
        _check_rows(lake.queue(OUTPUT[layout]).count(), rows, strategy.value)
        if small:
            check_small_output(spark, data, lake, f"{strategy.value} small ({read_as.value})")
        per_step = [jobs.count(g) for g in done]
        return Run(seconds, sum(jobs.count(g) for g in groups), stats["price"].steps, per_step, step_seconds)

    return run


def _spark_schema(schema: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def check_small_output(spark: Any, data: Data, lake: Lake, who: str) -> None:
    """The small-step output equals plain Spark's :func:`price` of the same rows (so the Arrow
    contender computes the same thing); compared sorted by id, every column."""
    fx = spark.read.parquet(str(data.fx))
    want = price(spark.read.schema(_spark_schema(POSTINGS)).parquet(str(data.small_files)), fx
                 ).toArrow().sort_by("id").cast(PRICED)
    got = lake.queue("priced").read_arrow(partition="0").select(PRICED.names).sort_by("id").cast(PRICED)
    if not got.equals(want):
        raise RuntimeError(f"{who}: its output differs from Spark's price() on the same rows: the "
                           "benchmark is invalid")


def _check_rows(got: int, want: int, who: str) -> None:
    if got != want:
        raise RuntimeError(f"{who}: wrote {got} rows, expected {want}: the benchmark is invalid")


CONTENDERS: dict[str, Callable[..., Run]] = {
    "spark_batch": run_spark_batch,
    "spark_streaming": run_spark_streaming(),
    # the backlog in one micro-batch (no per-trigger limit): issue 26's backlog comparison
    "spark_streaming_available_now": run_spark_streaming(one_file_per_trigger=False),
    "cues_exactly_once": run_cues(Strategy.EXACTLY_ONCE),
    "cues_at_least_once": run_cues(Strategy.AT_LEAST_ONCE),
    "cues_at_most_once": run_cues(Strategy.AT_MOST_ONCE),
    "cues_exactly_once_default": run_cues(Strategy.EXACTLY_ONCE, default_options=True),
    # the same backlog into a queue with based offsets (still the driver's write: auto up to 1M)
    "cues_exactly_once_default_based": run_cues(Strategy.EXACTLY_ONCE, default_options=True,
                                                layout=OffsetLayout.BASED),
    # the same 10 steps written by Spark's executors in one job into based files (issues 11 and 26)
    "cues_exactly_once_executors": run_cues(Strategy.EXACTLY_ONCE, writer=OutputWriter.EXECUTORS,
                                            layout=OffsetLayout.BASED),
    # issue 26: small fixed-size steps against Structured Streaming micro-batches of the same rows
    "spark_streaming_small": run_spark_streaming(small=True),
    "cues_exactly_once_small": run_cues(Strategy.EXACTLY_ONCE, small=True),
    # the same small steps reading their input as Arrow (ReadAs.ARROW) with price() in pyarrow
    "cues_exactly_once_small_arrow": run_cues(Strategy.EXACTLY_ONCE, small=True, read_as=ReadAs.ARROW),
}
SMALL = {"spark_streaming_small", "cues_exactly_once_small", "cues_exactly_once_small_arrow"}


def settle(spark: Any) -> None:
    """Before each timed run: collect the Python and JVM garbage the previous contender left, so
    that no contender pays for the one before it (in two runs without this, exactly_once ran
    right after Structured Streaming in rounds 0 and 1 and was slower than at_least_once there,
    faster in round 2: a suspicion, not a proof, so the harness removes the doubt)."""
    gc.collect()
    jvm = getattr(spark, "_jvm", None)  # classic sessions; Spark Connect has no JVM here
    if jvm is not None:
        jvm.System.gc()


def side_by_side(spark: Any, data: Data, rounds: int, names: list[str]) -> dict:
    fx = spark.read.parquet(str(data.fx)).cache()
    fx.count()
    jobs = Jobs(spark)

    def once(name: str) -> Run:
        work = Path(tempfile.mkdtemp(prefix=f"peers-{name}-", dir=data.root))
        settle(spark)
        try:
            return CONTENDERS[name](spark, data, fx, jobs, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    warmup = {}
    for name in names:  # Warm-up: every contender once, untimed for the results.
        warmup[name] = round(once(name).seconds, 3)
        print(f"warm-up {name}: {warmup[name]} s", flush=True)
    runs: dict[str, list[Run]] = {n: [] for n in names}
    orders = []
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        orders.append(order)
        for name in order:
            run = once(name)
            runs[name].append(run)
            print(f"round {r} {name}: {run.seconds:.3f} s, {run.steps} steps, {run.jobs} Spark jobs", flush=True)
    fx.unpersist()
    out: dict[str, Any] = {"rows": data.rows, "small_rows": data.small_rows, "small_steps": SMALL_STEPS,
                           "rounds": rounds, "warmup_s": warmup, "orders": orders, "contenders": {}}
    for name, rs in runs.items():
        secs = [r.seconds for r in rs]
        per_step = [j for r in rs for j in r.jobs_per_step]
        rows = data.small_rows * SMALL_STEPS if name in SMALL else data.rows
        out["contenders"][name] = {
            "rows": rows,
            "seconds": [round(s, 4) for s in secs], "median_s": round(median(secs), 4),
            "rows_per_s_median": round(rows / median(secs)),
            # per round: the p50 of the run's step (cues) / micro-batch (Structured Streaming) times
            "step_ms_p50_per_round": [round(percentile(r.step_seconds, 50) * 1000, 2) for r in rs],
            "steps": rs[-1].steps, "spark_jobs_per_run": [r.jobs for r in rs],
            # cues: counted per step (its own job group); Spark: jobs of a run / its micro-batches.
            "spark_jobs_per_step_median": median(per_step) if per_step else median(
                [r.jobs / max(r.steps, 1) for r in rs]),
            "spark_jobs_per_step_max": max(per_step) if per_step else max(r.jobs / max(r.steps, 1) for r in rs),
        }
    return out, runs


def ratio(runs: dict[str, list[Run]], ours: str, theirs: str) -> list[float]:
    """Per round: our throughput over theirs (= their time / our time)."""
    return [round(t.seconds / o.seconds, 4) for o, t in zip(runs[ours], runs[theirs], strict=True)]


def step_ratio(runs: dict[str, list[Run]], ours: str, theirs: str) -> list[float]:
    """Per round: our p50 step time over their p50 step (micro-batch) time."""
    return [round(percentile(o.step_seconds, 50) / percentile(t.step_seconds, 50), 4)
            for o, t in zip(runs[ours], runs[theirs], strict=True)]


# -- protocol work and one small commit ------------------------------------------------------------
class SmallCommits:
    """One small delta-rs commit (a 1-row append to a 2-column table, opened by its URI), timed:
    the yardstick of the protocol-work target, taken between the steps it is compared with."""

    def __init__(self, root: Path) -> None:
        from deltalake import write_deltalake

        self.write, self.uri = write_deltalake, str(root / "small-commit")
        self.table = pa.table({"a": [1], "b": ["x"]})
        self.write(self.uri, self.table)
        self.times: list[float] = []

    def once(self) -> None:
        t = time.perf_counter()
        self.write(self.uri, self.table, mode="append")
        self.times.append(time.perf_counter() - t)


def protocol_work(spark: Any, root: Path, steps: int, batch: int = 100) -> dict:
    """exactly_once at ``batch`` rows per step: per step, the time outside the read, the function
    and its materialization: (before_snapshot -> after_snapshot) + (after_prepare -> after_commit):
    planning the ranges and the step's one home commit (rows, positions, snapshot metadata).
    After each step's commit, one small delta-rs commit is timed (:class:`SmallCommits`), so both
    sides of the ratio see the same machine state, step by step."""
    marks: list[tuple[str, float]] = []
    small = SmallCommits(root)
    lake = Lake(root=str(root / "protocol"))
    g = cues_graph(Strategy.EXACTLY_ONCE, batch, fx=spark.createDataFrame(
        [(c, r) for c, r in RATES.items()], "currency string, rate double"))
    create_queues(g, lake)
    rng = np.random.default_rng(5)
    lake.queue("postings").append(chunk(0, batch * steps, rng), partition="0")

    def hook(point: str) -> None:
        marks.append((point, time.perf_counter()))
        if point == "after_commit":
            small.once()

    GraphRunner(graph=g, lake=lake, spark=spark, keep_results=False, hook=hook).run_until_idle()
    work, whole, current = [], [], {}
    for point, t in marks:
        current[point] = t
        if point == "after_commit":
            c = current
            work.append((c["after_snapshot"] - c["before_snapshot"]) + (c["after_commit"] - c["after_prepare"]))
            whole.append(c["after_commit"] - c["before_snapshot"])
    return {"steps": len(work), "rows_per_step": batch, "protocol_ms_p50": round(percentile(work, 50) * 1000, 2),
            "protocol_ms_p99": round(percentile(work, 99) * 1000, 2),
            "step_ms_p50": round(percentile(whole, 50) * 1000, 2),
            "small_delta_commit_ms": round(median(small.times) * 1000, 3),
            "small_commits": len(small.times)}


# -- recovery at the real retention ----------------------------------------------------------------
def recovery(spark: Any, root: Path, histories: list[int], runs: int = 15) -> dict:
    """Recovery after ``n`` one-commit steps of a map, its home queue as the steps leave it (a
    digest every 1,000 steps, the log trimmed below what the digests cover:
    ``bench_processors.build_history``) and maintained as a deployment maintains it (``cues
    queue maintain``: compaction, checkpoint, vacuum at the default retention, not forced to 0)."""
    from bench_processors import build_history, graph, time_recovery

    from cues_platform.queues import maintenance

    out: dict[str, Any] = {}
    roots, times = {}, {n: [] for n in histories}
    g = graph(Strategy.EXACTLY_ONCE, 10)
    for n in histories:
        lake_root = root / f"recovery-{n}"
        lake = Lake(root=str(lake_root))
        create_queues(g, lake)
        build_history(lake, g, n)
        maintenance.maintain(Lake(root=str(lake_root)).queue("converted"))
        roots[n] = lake_root
    for n in histories:  # warm-up, untimed
        time_recovery(spark, str(roots[n]), g, n, 1)
    for r in range(runs):  # side by side: one recovery of each history per round, order rotated
        for n in histories[r % len(histories):] + histories[:r % len(histories)]:
            times[n].append(time_recovery(spark, str(roots[n]), g, n, 1))
    for n in histories:
        out[str(n)] = {"records": n, "recover_s_median": round(median(times[n]), 5),
                       "recover_s": [round(t, 5) for t in times[n]]}
        print("recovery", out[str(n)], flush=True)
        shutil.rmtree(roots[n], ignore_errors=True)
    out["ratio_large_over_small"] = round(out[str(histories[-1])]["recover_s_median"]
                                          / out[str(histories[0])]["recover_s_median"], 3)
    return out


def _source(path: Path, d: dict) -> str:
    return (f"{path.name} measured at {d.get('at')} (git {d.get('machine', {}).get('git_commit')}), "
            "not in this run")


def paced_postings_p99(path: Path) -> dict:
    if not path.exists():
        return {"value": None, "source": f"{path} (missing: run bench/bench_participants.py)"}
    d = json.loads(path.read_text())
    entry = next((t for t in d.get("targets", []) if t.get("id") == "paced_p99"), None)
    if entry is not None:  # computed by bench_participants.py (None when not paced at 300/s)
        return {"value": entry["measured"], "source": f"{_source(path, d)}; {entry['detail']}"}
    # a file written before its targets: the paced p99, if the phase was offered 300/s
    paced = d.get("paced", {})
    p99 = paced.get("latency_ms", {}).get("p99")
    if p99 is None or paced.get("offered_rate") != 300.0:
        return {"value": None, "source": f"{_source(path, d)}; no paced phase at 300/s"}
    return {"value": p99 / 1000, "source": _source(path, d)}


MEMORY_TARGETS = {  # bench_driver_memory.py's target ids read here -> what they measure
    "default_writer": "the default writer (auto), the backlog in one step",
    "default_options": "default Options (steps of at most max_batch_size, 1M rows)",
}


def driver_memory(path: Path) -> dict[str, dict]:
    """Per ``MEMORY_TARGETS`` id: the Python driver peak at the largest backlog over its peak at
    the smallest, from ``bench_driver_memory.py``'s JSON (its ``targets``)."""
    if not path.exists():
        return {i: {"value": None, "detail": "", "source": f"{path} (missing: run bench/bench_driver_memory.py)"}
                for i in MEMORY_TARGETS}
    d = json.loads(path.read_text())
    out = {}
    for ident in MEMORY_TARGETS:
        entry = next((t for t in d.get("targets", []) if t.get("id") == ident), None)
        out[ident] = ({"value": None, "detail": "", "source": _source(path, d) + f"; it has no {ident} run "
                       "(written before issue 26): run bench/bench_driver_memory.py"} if entry is None
                      else {"value": entry["measured"], "detail": entry["detail"], "source": _source(path, d)})
    return out


# -- targets ---------------------------------------------------------------------------------------
def targets(side: dict, runs: dict[str, list[Run]], proto: dict, commit_s: float, rec: dict | None,
            paced: dict, memory: dict[str, dict]) -> list[dict]:
    """Issue 26's targets, each with what was measured, the bound and PASS/FAIL computed here
    (NOT MEASURED when this run or the file it reads lacks the contenders)."""
    def row(name: str, measured: float | None, op: str, bound: float, detail: str) -> dict:
        ok = measured is not None and (measured >= bound if op == ">=" else measured <= bound)
        return {"target": name, "measured": None if measured is None else round(measured, 4), "op": op,
                "bound": bound, "result": "NOT MEASURED" if measured is None else "PASS" if ok else "FAIL",
                "detail": detail}

    def have(*names: str) -> bool:
        return all(n in runs for n in names)

    def missing(*names: str) -> str:
        return f"not in this run: contenders {[n for n in names if n not in runs]}"

    rows: list[dict] = []
    small = side.get("small_rows", 0)
    # The target is taken with the configuration a user picks for small steps: inputs read as
    # Arrow (ReadAs.ARROW) and the transform in pyarrow (its output checked equal to Spark's); the
    # same steps with the Spark function are reported beside it in the detail.
    name = (f"small steps ({SMALL_STEPS} x {small:,} rows, fixed size): EO p50 step time (inputs "
            "read as Arrow) / Structured Streaming p50 micro-batch time")
    if have("cues_exactly_once_small_arrow", "spark_streaming_small"):
        rs = step_ratio(runs, "cues_exactly_once_small_arrow", "spark_streaming_small")

        def p50s(who: str) -> list[float]:
            return [round(percentile(r.step_seconds, 50) * 1000, 1) for r in runs[who]]

        detail = (f"per round {rs}; EO (Arrow) p50 ms {p50s('cues_exactly_once_small_arrow')}, "
                  f"SS triggerExecution p50 ms {p50s('spark_streaming_small')}")
        if have("cues_exactly_once_small"):
            spark_fn = step_ratio(runs, "cues_exactly_once_small", "spark_streaming_small")
            detail += (f"; EO with the Spark function: p50 ms {p50s('cues_exactly_once_small')}, "
                       f"ratio per round {spark_fn} (median {median(spark_fn)})")
        rows.append(row(name, median(rs), "<=", 0.33, detail))
    else:
        rows.append(row(name, None, "<=", 0.33,
                        missing("cues_exactly_once_small_arrow", "spark_streaming_small")))
    for theirs, bound, what in [("spark_streaming_available_now", 1.0, "Structured Streaming availableNow "
                                 "(one micro-batch, no per-trigger limit)"),
                                ("spark_batch", 0.8, "plain Spark batch")]:
        name = f"backlog of {side['rows']:,}, default Options: EO throughput / {what}"
        if have("cues_exactly_once_default", theirs):
            rs = ratio(runs, "cues_exactly_once_default", theirs)
            steps = side["contenders"]["cues_exactly_once_default"]["steps"]
            rows.append(row(name, median(rs), ">=", bound, f"per round {rs}; EO in {steps} step(s)"))
        else:
            rows.append(row(name, None, ">=", bound, missing("cues_exactly_once_default", theirs)))
    fixed = f"{CHUNKS} fixed steps of {side['rows'] // CHUNKS:,}"
    for theirs, bound, name in [
            ("spark_streaming", 1.3, f"{fixed}: EO throughput / Structured Streaming (maxFilesPerTrigger=1)"),
            ("cues_at_least_once", 0.97, f"{fixed}: EO throughput / ALO throughput")]:
        if have("cues_exactly_once", theirs):
            rs = ratio(runs, "cues_exactly_once", theirs)
            rows.append(row(name, median(rs), ">=", bound, f"per round {rs}"))
        else:
            rows.append(row(name, None, ">=", bound, missing("cues_exactly_once", theirs)))
    rows.append(row("protocol work per step p50 / one small delta-rs commit",
                    proto["protocol_ms_p50"] / 1000 / commit_s, "<=", 1.2,
                    f"{proto['protocol_ms_p50']} ms vs {commit_s * 1000:.2f} ms"))
    if rec is not None:
        keys = [k for k in rec if k.isdigit()]
        rows.append(row(f"recovery after {int(keys[-1]):,} steps / after {keys[0]} (shipped retention)",
                        rec["ratio_large_over_small"], "<=", 1.2,
                        f"{rec[keys[-1]]['recover_s_median'] * 1000:.1f} ms vs "
                        f"{rec[keys[0]]['recover_s_median'] * 1000:.1f} ms"))
    else:
        rows.append(row("recovery after 10,000 steps / after 10 (shipped retention)", None, "<=", 1.2,
                        "not in this run (--recovery-steps 0)"))
    rows.append(row("postings paced at 300/s: p99 latency (s)", paced["value"], "<=", 1.0, paced["source"]))
    for ident, what in MEMORY_TARGETS.items():
        m = memory[ident]
        rows.append(row(f"driver memory, {what}: Python peak at the largest backlog / at the smallest",
                        m["value"], "<=", 1.2, f"{m['detail']}; {m['source']}".lstrip("; ")))
    return rows


def reported(side: dict) -> list[dict]:
    """Figures the issue asks for without a bound: Spark jobs per step (cues: counted per step
    in its own job group; Structured Streaming and batch: jobs of a run / its micro-batches)."""
    return [{"figure": f"Spark jobs per step: {name}", "median": c["spark_jobs_per_step_median"],
             "max": c["spark_jobs_per_step_max"], "steps": c["steps"]}
            for name, c in side["contenders"].items()]


def print_tables(side: dict, rows: list[dict]) -> None:
    print(f"\n{side['rows']:,} postings, {side['rounds']} rounds (orders rotated)")
    print(f"{'contender':30} {'median s':>9} {'rows/s':>10} {'steps':>5} {'step p50 ms':>11} "
          f"{'jobs/run':>9} {'jobs/step':>9}")
    for name, c in side["contenders"].items():
        jps = "" if c["spark_jobs_per_step_median"] is None else f"{c['spark_jobs_per_step_median']:g}"
        print(f"{name:30} {c['median_s']:9.3f} {c['rows_per_s_median']:10,} {c['steps']:5} "
              f"{median(c['step_ms_p50_per_round']):11.1f} {median(c['spark_jobs_per_run']):9g} {jps:>9}")
    print(f"\n{'target':100} {'measured':>9} {'bound':>8} result")
    for r in rows:
        m = "n/a" if r["measured"] is None else f"{r['measured']:.3f}"
        print(f"{r['target']:100} {m:>9} {r['op']}{r['bound']:>6} {r['result']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="postings (10 chunks); default 1M")
    parser.add_argument("--small-rows", type=int, default=1_000,
                        help=f"rows per small step ({SMALL_STEPS} steps); default 1,000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset")
    parser.add_argument("--protocol-steps", type=int, default=30)
    parser.add_argument("--recovery-steps", type=int, default=10_000, help="0: skip the recovery target")
    parser.add_argument("--postings-json", type=Path, default=HERE / "results" / "participants.json")
    parser.add_argument("--memory-json", type=Path, default=HERE / "results" / "driver_memory.json",
                        help="bench_driver_memory.py's results (the driver-memory target is read there)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "peers.json")
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. how loaded the machine was)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run proving the code (numbers meaningless): 200,000 rows, 1 round, "
                             "10 protocol steps, recovery 10 vs 200; writes /tmp/peers-quick.json "
                             "unless --out is given")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.rounds, args.protocol_steps = 200_000, 1, 10
        args.recovery_steps = min(args.recovery_steps, 200) or 0
        if args.out == parser.get_default("out"):
            args.out = Path(tempfile.gettempdir()) / "peers-quick.json"
    if args.rows % CHUNKS or args.rows < CHUNKS:
        parser.error(f"--rows must be a positive multiple of {CHUNKS}")
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = sorted(set(names) - set(CONTENDERS))
    if unknown:
        parser.error(f"unknown contenders {unknown}; choose from {sorted(CONTENDERS)}")

    from cues_platform.spark import get_spark

    spark = get_spark()
    root = Path(tempfile.mkdtemp(prefix="cues-peers-"))
    started = now_iso()
    load_start = round(os.getloadavg()[0], 1)
    try:
        data = generate(root, args.rows, args.small_rows)
        side, runs = side_by_side(spark, data, args.rounds, names)
        proto = protocol_work(spark, root, args.protocol_steps)
        commit_s = proto["small_delta_commit_ms"] / 1000
        rec = recovery(spark, root, [10, args.recovery_steps]) if args.recovery_steps else None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    paced = paced_postings_p99(args.postings_json)
    memory = driver_memory(args.memory_json)
    rows = targets(side, runs, proto, commit_s, rec, paced, memory)
    ratios = {}
    for ours, theirs in [("cues_exactly_once", "spark_streaming"), ("cues_exactly_once", "spark_batch"),
                         ("cues_exactly_once_default", "spark_batch"),
                         ("cues_exactly_once_default", "spark_streaming_available_now"),
                         ("cues_exactly_once_small", "spark_streaming_small"),
                         ("cues_exactly_once", "cues_at_least_once"),
                         ("cues_exactly_once", "cues_at_most_once"),
                         ("cues_exactly_once_executors", "cues_exactly_once")]:
        if ours in runs and theirs in runs:
            rs = ratio(runs, ours, theirs)
            ratios[f"{ours}/{theirs}"] = {"per_round": rs, "median": median(rs)}
    result = {
        "benchmark": "peers", "at": started, "machine": machine_info(), "note": args.note,
        "quick": args.quick,
        "config": {"rows": args.rows, "chunks": CHUNKS, "small_rows": args.small_rows, "small_steps": SMALL_STEPS,
                   "rounds": args.rounds, "master": spark.sparkContext.master,
                   "protocol_steps": args.protocol_steps, "recovery_steps": args.recovery_steps},
        # other processes on the machine change the numbers: keep the 1-minute load with them
        "load_average_1m": {"start": load_start, "end": round(os.getloadavg()[0], 1)},
        "side_by_side": side, "throughput_ratios": ratios,
        "protocol": proto,
        "recovery": rec, "paced_postings": paced, "driver_memory": memory,
        "targets": rows, "reported": reported(side),
    }
    print_tables(side, rows)
    print("wrote", write_json(args.out, result))


if __name__ == "__main__":
    main()
