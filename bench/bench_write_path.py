"""Where a 1M-row backlog step's time goes, and what a faster driver write path would gain (issue 26, decision 2).

Run: ``.venv/bin/python bench/bench_write_path.py [--rows 1000000] [--rounds 3]`` -> bench/results/write_path.json
(a smoke run: ``--rows 100000 --rounds 1 --out /tmp/write-path-smoke.json``).

The workload is ``bench/bench_peers.py``'s: ``--rows`` postings in one input queue (10 appends),
priced with a broadcast fx join and status rules (:func:`bench_peers.price`), ONE exactly_once MAP
processor with default ``Options`` (one backlog step of up to 1M rows, ``OutputWriter.AUTO``:
the driver writes it). Every contender below is that whole step (``GraphRunner.recover`` +
``run_until_idle`` on a fresh copy of the lake), except the two plain-Spark references.

Breakdown (contender ``baseline``, the product as it is): the step's hook points give plan /
read / function / prepare / commit; inside them, timing wrappers installed by this script (not
by the product) give the Spark job to Arrow (``outputs.to_arrow``), conforming
(``outputs.conformed``), the metadata columns (``appender._with_metadata``) and delta-rs'
``write_deltalake`` (Parquet encode + file write + commit). The delta-rs commit alone is
estimated by a zero-row commit with the same kind of app transactions on the same queue.

Alternatives, each a whole step, patched in by this script (nothing in the product changes):

- ``stream_1file``: the result's Arrow record batches are read from the JVM's socket as they
  arrive (``Dataset.collectAsArrowToPython``, read with a plain ``ArrowStreamSerializer``
  instead of ``ArrowCollectSerializer``, which holds every batch until the last one to put them
  in partition order), each conformed, given its metadata columns and ``_offset = start + rows
  so far``, and written into ONE Parquet file while the job still runs; the file is committed
  by reference (``by_reference.append_written``: footers, density check, one commit with the
  same app transactions). Offsets are dense but assigned in ARRIVAL order (see the JSON's
  ``notes``).
- ``stream_roll``: the same stream, cut into files of ``--roll-rows`` rows, each written by a
  2-thread pool while the next rows arrive.
- ``deltars_writer``: the product with every append written by delta-rs' ``write_deltalake``
  (``parallel_files.PARALLEL_MIN_ROWS`` raised out of reach): the driver path before a big
  append's files were written on several threads (``queues/parallel_files.py``, 2026-11-29).
  Until then this script had ``driver_parallel_k`` contenders patching the same idea in from
  outside (``write_path.json``, ``write_path-2.json``); the product does it now (``baseline``).
- ``arrow_batch_100k``: the product with ``spark.sql.execution.arrow.maxRecordsPerBatch`` 100k
  (Spark's default is 10k).
- ``executors``: ``OutputWriter.EXECUTORS`` (two Spark jobs, the executors write the files).
- ``spark_batch`` (plain ``read.parquet -> price -> write.parquet``) and ``spark_noop`` (the same
  job with the ``noop`` sink: the Spark work alone, nothing crosses to Python or disk).

One Spark session (``local[*]``); every contender warmed up once; ``--rounds`` rounds with the
order rotated by one each round; medians; ratios per round against ``baseline`` (both sides saw
the same machine state), their median reported. The load average is recorded around every run:
the machine is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from bench_peers import CHUNKS, FX, OUTPUT, POSTINGS, RATES, _spark_schema, chunk, cues_graph, price  # noqa: E402
from common import machine_info, median, now_iso, write_json  # noqa: E402

from cues_platform import clock  # noqa: E402
from cues_platform.processing import GraphRunner, OutputWriter, Strategy  # noqa: E402
from cues_platform.processing import step as step_module  # noqa: E402
from cues_platform.processing.runner import create_queues  # noqa: E402
from cues_platform.queues import (  # noqa: E402
    Lake,
    OffsetLayout,
    parallel_files,  # noqa: E402
)
from cues_platform.queues import appender as appender_module  # noqa: E402
from cues_platform.queues.appender import AppendOptions, append_batches  # noqa: E402
from cues_platform.queues.by_reference import read_footer, verify_written  # noqa: E402
from cues_platform.queues.filesystems import filesystem_for  # noqa: E402
from cues_platform.queues.names import join_uri  # noqa: E402
from cues_platform.queues.schema import OFFSET, PARTITION, conform  # noqa: E402


@dataclass
class Data:
    root: Path
    rows: int
    files: Path  # CHUNKS parquet files (the plain-Spark references)
    fx: Path
    lake: Path  # template lake: queue "postings" holding the same CHUNKS chunks


# the driver's write path and its variants, into a queue with absolute offsets (bench_peers' OUTPUT)
LAYOUT = OffsetLayout.ABSOLUTE


def generate(root: Path, rows: int) -> Data:
    """bench_peers' data (same seed, same chunks): the input files and a template lake."""
    rng = np.random.default_rng(11)
    data = Data(root, rows, root / "input", root / "fx.parquet", root / "lake-template")
    data.files.mkdir(parents=True)
    pq.write_table(pa.table({"currency": list(RATES), "rate": list(RATES.values())}, schema=FX), data.fx)
    lake = Lake(root=str(data.lake))
    create_queues(cues_graph(Strategy.EXACTLY_ONCE, rows // CHUNKS, fx=None), lake)
    queue = lake.queue("postings")
    size = rows // CHUNKS
    for i in range(CHUNKS):
        t = chunk(i * size, size, rng)
        pq.write_table(t, data.files / f"part-{i:03d}.parquet")
        queue.append(t, partition="0")
    return data


# -- patching (this script only) -------------------------------------------------------------------
@contextlib.contextmanager
def patched(target: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, old)


class Timers:
    """Seconds spent inside wrapped functions, by label (summed over calls)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - t
                self.calls[label] = self.calls.get(label, 0) + 1
        return timed


class Cpu:
    """CPU seconds (user + system, every thread) of this Python process and of Spark's JVM: on a
    shared machine they say how much work a contender did, whatever the load did to its wall time."""

    def __init__(self, spark: Any) -> None:
        jvm = getattr(spark, "_jvm", None)
        self.jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid()) if jvm is not None else None
        self.tick = os.sysconf("SC_CLK_TCK")

    def jvm_s(self) -> float:
        if self.jvm_pid is None:
            return 0.0
        fields = Path(f"/proc/{self.jvm_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime, stime

    def now(self) -> tuple[float, float]:
        return time.process_time(), self.jvm_s()

    def since(self, then: tuple[float, float]) -> dict:
        py, jvm = self.now()
        return {"python_cpu_s": round(py - then[0], 3), "jvm_cpu_s": round(jvm - then[1], 3),
                "cpu_s": round(py - then[0] + jvm - then[1], 3)}


def instrumented(timers: Timers) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for target, name, label in [
        (step_module, "to_arrow", "spark_job_to_arrow"),
        (step_module, "conformed", "conform"),
        (appender_module, "_with_metadata", "metadata_columns"),
        (appender_module, "write_deltalake", "deltars_write_and_commit"),
        (parallel_files, "write_parts", "parallel_write_and_commit"),
    ]:
        stack.enter_context(patched(target, name, timers.wrap(label, getattr(target, name))))
    return stack


# -- alternative (a): stream the result's batches into Parquet while they arrive -------------------
def arrival_batches(frame: Any) -> Iterator[pa.RecordBatch]:
    """The result's Arrow batches in the order the JVM sends them (as Spark partitions finish)."""
    from pyspark.errors.exceptions.captured import unwrap_spark_exception
    from pyspark.sql.pandas.serializers import ArrowStreamSerializer
    from pyspark.traceback_utils import SCCallSiteSync
    from pyspark.util import _load_from_socket

    with SCCallSiteSync(frame.sparkSession.sparkContext):
        port, secret, server = frame._jdf.collectAsArrowToPython()
    try:
        with _load_from_socket((port, secret), ArrowStreamSerializer()) as stream:
            # the stream ends before the order indices; closing the socket drops them
            yield from stream
    finally:
        with unwrap_spark_exception():
            server.getResult()


def stream_writer(roll_rows: int | None) -> Callable[..., Any]:
    """A stand-in for ``write_by_executors`` with the same contract (``WrittenPart`` or None),
    written from the driver as the batches arrive."""

    def write(frame: Any, queue: Any, *, partition: str, delivery_hash: str,
              message_type: str = "message", cache: bool = False) -> Any:
        start = queue.next_offset(partition)
        now = pa.scalar(clock.now_ms() * 1000, pa.timestamp("us", tz="UTC"))
        opts = AppendOptions(delivery_hash=delivery_hash, message_type=message_type)
        file_schema = pa.schema([f for f in queue.table_schema if f.name != PARTITION])
        folder = f"_partition={partition}"
        filesystem, root = filesystem_for(join_uri(queue.uri, folder), queue.lake.options)
        filesystem.create_dir(root, recursive=True)
        relatives: list[str] = []
        rows = 0

        def new_file() -> tuple[str, Any]:
            relative = f"{folder}/stream-{delivery_hash[:8]}-{uuid.uuid4().hex[:12]}.parquet"
            relatives.append(relative)
            return relative, filesystem.open_output_stream(f"{root}/{relative.split('/', 1)[1]}")

        def prepared(batch: pa.RecordBatch, first: int) -> pa.Table:
            table = conform(pa.Table.from_batches([batch]), queue.payload_schema, queue=queue.name,
                            max_rows=queue.max_batch_rows)
            table = appender_module._with_metadata(table, partition=partition, start=first, opts=opts, now=now,
                                                   schema=queue.table_schema, based=False)
            return table.drop_columns([PARTITION]).cast(file_schema)

        if roll_rows is None:
            writer = sink = None
            for batch in arrival_batches(frame):
                if not batch.num_rows:
                    continue
                if writer is None:
                    _, sink = new_file()
                    writer = pq.ParquetWriter(sink, file_schema)
                writer.write_table(prepared(batch, start + rows))
                rows += batch.num_rows
            if writer is not None:
                writer.close()
                sink.close()
        else:
            def write_file(tables: list[pa.Table]) -> None:
                _, out = new_file()
                with out:
                    pq.write_table(pa.concat_tables(tables), out)

            with ThreadPoolExecutor(2) as pool:
                futures, pending, held = [], [], 0
                for batch in arrival_batches(frame):
                    if not batch.num_rows:
                        continue
                    pending.append(prepared(batch, start + rows))
                    rows += batch.num_rows
                    held += batch.num_rows
                    if held >= roll_rows:
                        futures.append(pool.submit(write_file, pending))
                        pending, held = [], 0
                if pending:
                    futures.append(pool.submit(write_file, pending))
                for f in futures:
                    f.result()
        if rows == 0:
            return None
        footers = [read_footer(queue, r) for r in relatives]
        return verify_written(queue, partition, start, footers)

    return write


def always_this_output(processor: Any, graph: Any, by_binding: Any, *, home: str | None, input_rows: int) -> Any:
    """Route the step's one DataFrame output to the stand-in writer (the bench's workload only)."""
    binding = next(iter(by_binding))
    return processor.outputs[binding]


# -- alternative (b): k threads writing Parquet slices, one commit ---------------------------------
# -- contenders ------------------------------------------------------------------------------------
def cues_step(variant: str, args: argparse.Namespace) -> Callable[..., dict]:
    def run(spark: Any, data: Data, fx: Any, work: Path) -> dict:
        root = work / "lake"
        shutil.copytree(data.lake, root)
        lake = Lake(root=str(root))
        writer = OutputWriter.EXECUTORS if variant == "executors" else OutputWriter.AUTO
        graph = cues_graph(Strategy.EXACTLY_ONCE, None, fx=fx, writer=writer, layout=LAYOUT)
        marks: list[tuple[str, float]] = []
        timers = Timers()
        stack = contextlib.ExitStack()
        if variant == "baseline":
            stack.enter_context(instrumented(timers))
        elif variant.startswith("stream"):
            roll = None if variant == "stream_1file" else args.roll_rows
            stack.enter_context(patched(step_module, "executor_output", always_this_output))
            stack.enter_context(patched(step_module, "write_by_executors", stream_writer(roll)))
        elif variant == "deltars_writer":
            stack.enter_context(patched(parallel_files, "PARALLEL_MIN_ROWS", 2**62))
        elif variant == "arrow_batch_100k":
            old = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100000")
            stack.callback(spark.conf.set, "spark.sql.execution.arrow.maxRecordsPerBatch", old)
        with stack:
            t = time.perf_counter()
            runner = GraphRunner(graph=graph, lake=lake, spark=spark, keep_results=False,
                                 hook=lambda p: marks.append((p, time.perf_counter())))
            runner.recover()
            stats = runner.run_until_idle()
            seconds = time.perf_counter() - t
        out = {"seconds": seconds, "steps": stats["price"].steps, "phases": phases(marks, t, seconds),
               "inside": {k: round(v, 4) for k, v in timers.seconds.items()}}
        if variant == "baseline":
            out["inside"]["deltars_commit_only_est"] = round(zero_row_commit_s(lake), 4)
        out["check"] = check_output(lake, data.rows, out["steps"])
        return out

    return run


def phases(marks: list[tuple[str, float]], t0: float, total: float) -> dict:
    """Seconds between the step hooks (summed over steps); ``outside_steps``: recover, runner."""
    at: dict[str, float] = {}
    sums = {"plan": 0.0, "read": 0.0, "function": 0.0, "prepare": 0.0, "commit": 0.0}
    steps_s = 0.0
    for point, t in marks:
        at[point] = t
        if point == "after_commit":
            sums["plan"] += at["after_snapshot"] - at["before_snapshot"]
            sums["read"] += at["after_read"] - at["after_snapshot"]
            sums["function"] += at["after_function"] - at["after_read"]
            sums["prepare"] += at["after_prepare"] - at["after_function"]
            sums["commit"] += t - at["after_prepare"]
            steps_s += t - at["before_snapshot"]
    return {**{k: round(v, 4) for k, v in sums.items()}, "outside_steps": round(total - steps_s, 4)}


def zero_row_commit_s(lake: Lake, n: int = 5) -> float:
    """One commit of no rows with two app transactions on the step's queue (after the step)."""
    queue = lake.queue(OUTPUT[LAYOUT])
    times = []
    for i in range(n):
        t = time.perf_counter()
        append_batches(queue, {}, allow_empty=True, app_transactions=[("bench:commit", i + 1), ("bench:other", i + 1)],
                       commit_metadata={"cues.bench": "commit-only"})
        times.append(time.perf_counter() - t)
    return median(times)


def check_output(lake: Lake, rows: int, steps: int) -> dict:
    """The output: every id once, offsets dense from 0, one commit per step (outside the timing)."""
    from deltalake import DeltaTable

    from cues_platform.queues.based import read_delta

    dt = DeltaTable(lake.queue(OUTPUT[LAYOUT]).uri)
    table = read_delta(dt, columns=["id", OFFSET])  # offsets absolute (a based queue's too)
    offsets = pc.sort_indices(table[OFFSET])
    ids = pc.take(table["id"], offsets).to_numpy()
    dense = table.num_rows == rows and pc.all(pc.equal(pc.take(table[OFFSET], offsets),
                                                       pa.array(range(rows), pa.int64()))).as_py()
    unique_ids = len(set(ids.tolist())) == rows
    step_commits = sum(1 for h in dt.history() if "cues.step" in h and "cues.bench" not in h)
    ok = bool(dense and unique_ids and step_commits == steps)
    if not ok:
        raise RuntimeError(f"invalid output: rows {table.num_rows}/{rows}, dense {dense}, ids unique {unique_ids}, "
                           f"step commits {step_commits}")
    in_input_order = bool((ids[1:] > ids[:-1]).all())
    return {"rows": table.num_rows, "offsets_dense": True, "one_commit_per_step": True,
            "offsets_follow_input_order": in_input_order}


def spark_reference(noop: bool) -> Callable[..., dict]:
    def run(spark: Any, data: Data, fx: Any, work: Path) -> dict:
        t = time.perf_counter()
        frame = price(spark.read.schema(_spark_schema(POSTINGS)).parquet(str(data.files)), fx)
        if noop:
            frame.write.format("noop").mode("overwrite").save()
        else:
            frame.write.mode("overwrite").parquet(str(work / "out"))
        return {"seconds": time.perf_counter() - t, "steps": 1}

    return run


# -- the parts alone, tightly interleaved ----------------------------------------------------------
def interleaved(variants: dict[str, Callable[[], Any]], reps: int, cpu: Cpu, label: str) -> dict:
    """Run every variant ``reps`` times (plus one warm-up pass), order rotated each pass; wall and
    CPU medians, and per-pass ratios against the first variant."""
    names = list(variants)
    loads = [round(os.getloadavg()[0], 2)]
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps + 1):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            gc.collect()
            mark = cpu.now()
            t = time.perf_counter()
            variants[name]()
            wall = time.perf_counter() - t
            used = cpu.since(mark)["cpu_s"]
            if rep:
                walls[name].append(wall)
                cpus[name].append(used)
            print(f"{label} {'warm-up' if not rep else f'pass {rep}'} {name}: {wall:.3f} s, cpu {used} s", flush=True)
        loads.append(round(os.getloadavg()[0], 2))
    first = names[0]
    out = {}
    for n in names:
        speed = [round(b / w, 4) for b, w in zip(walls[first], walls[n], strict=True)]
        out[n] = {"wall_s": [round(w, 4) for w in walls[n]], "wall_s_median": round(median(walls[n]), 4),
                  "cpu_s_median": round(median(cpus[n]), 4),
                  f"speed_vs_{first}_per_pass": speed, f"speed_vs_{first}_median": median(speed),
                  f"cpu_vs_{first}_median": median([round(c / b, 4) for b, c in zip(cpus[first], cpus[n], strict=True)])}
    return {"reps": reps, "load1_after_each_pass": loads, "variants": out}


def write_side(spark: Any, data: Data, fx: Any, cpu: Cpu, reps: int, root: Path) -> dict:
    """The product's write + commit (``append_batches`` of the conformed table, with a step's app
    transactions and metadata) into an empty queue, the writer swapped; the rows are the step's
    1M rows, collected once."""
    from deltalake import WriterProperties

    frame = price(spark.read.schema(_spark_schema(POSTINGS)).parquet(str(data.files)), fx)
    graph = cues_graph(Strategy.EXACTLY_ONCE, None, fx=None, layout=LAYOUT)
    template = Lake(root=str(root / "write-side-template"))
    create_queues(graph, template)
    table = conform(frame.toArrow(), template.queue(OUTPUT[LAYOUT]).payload_schema, queue=OUTPUT[LAYOUT],
                    max_rows=10_000_000)
    n = [0]

    def append(*, parallel: bool, properties: Any = None) -> Callable[[], Any]:
        def run() -> Any:
            n[0] += 1
            lake_root = root / f"write-side-{n[0]}"
            shutil.copytree(template.root, lake_root)
            lake = Lake(root=str(lake_root))
            queue = lake.queue(OUTPUT[LAYOUT])
            stack = contextlib.ExitStack()
            if not parallel:  # delta-rs' write_deltalake, as for appends below the threshold
                stack.enter_context(patched(parallel_files, "PARALLEL_MIN_ROWS", 2**62))
            if properties is not None:
                original = appender_module.write_deltalake
                stack.enter_context(patched(appender_module, "write_deltalake",
                                            lambda *a, **k: original(*a, writer_properties=properties, **k)))
            with stack:
                append_batches(queue, {"0": table}, prepared=True, delivery_hash="b" * 64,
                               app_transactions=[("proc:price", 1), ("epoch:price", 1), ("pos:price:postings/0", 1)],
                               commit_metadata={"cues.processor": "price", "cues.step": "1"})
            return lake_root

        return run

    variants = {
        "parallel_files (product: a thread per core)": append(parallel=True),
        "deltars_write_deltalake (before parallel_files)": append(parallel=False),
        "deltars_lz4": append(parallel=False, properties=WriterProperties(compression="LZ4")),
        "deltars_uncompressed": append(parallel=False, properties=WriterProperties(compression="UNCOMPRESSED")),
    }
    out = interleaved(variants, reps, cpu, "write side")
    out["rows"] = table.num_rows
    out["arrow_bytes"] = table.nbytes
    return out


def spark_side(spark: Any, data: Data, fx: Any, cpu: Cpu, reps: int, root: Path) -> dict:
    """The Spark job of the step's plan, ended five ways."""

    def frame() -> Any:
        return price(spark.read.schema(_spark_schema(POSTINGS)).parquet(str(data.files)), fx)

    def to_arrow_with(batch: str | None) -> Callable[[], Any]:
        def run() -> Any:
            if batch is None:
                return frame().toArrow().num_rows
            old = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
            spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", batch)
            try:
                return frame().toArrow().num_rows
            finally:
                spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", old)
        return run

    from cues_platform.queues.reader import read_spark

    queue = Lake(root=str(data.lake)).queue("postings")

    def step_frame() -> Any:  # the step's own read: the queue's files, the offset filter (reader.py)
        return price(read_spark(queue, spark, partition="0", start=0, end=data.rows), fx)

    n = [0]

    def parquet() -> None:
        n[0] += 1
        frame().write.parquet(str(root / f"spark-side-{n[0]}"))

    variants = {
        "toArrow (product)": to_arrow_with(None),
        "noop sink (the job alone)": lambda: frame().write.format("noop").mode("overwrite").save(),
        "toArrow maxRecordsPerBatch=100k": to_arrow_with("100000"),
        "arrival-order batch stream (consumed, not kept)": lambda: sum(b.num_rows for b in arrival_batches(frame())),
        "executors write parquet": parquet,
        "queue read (the step's input) -> toArrow": lambda: step_frame().toArrow().num_rows,
        "queue read (the step's input) -> noop sink": lambda: step_frame().write.format("noop").mode("overwrite").save(),
    }
    return interleaved(variants, reps, cpu, "spark side")


def contenders(args: argparse.Namespace) -> dict[str, Callable[..., dict]]:
    out: dict[str, Callable[..., dict]] = {}
    for name in ["baseline", "stream_1file", "stream_roll", "deltars_writer",
                 "arrow_batch_100k", "executors"]:
        out[name] = cues_step(name, args)
    out["spark_batch"] = spark_reference(noop=False)
    out["spark_noop"] = spark_reference(noop=True)
    return out


def settle(spark: Any) -> None:
    gc.collect()
    jvm = getattr(spark, "_jvm", None)
    if jvm is not None:
        jvm.System.gc()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--roll-rows", type=int, default=250_000, help="stream_roll: rows per file")
    parser.add_argument("--contenders", default="", help="comma-separated subset (default: all)")
    parser.add_argument("--component-reps", type=int, default=5, help="passes of the part benchmarks (0: skip)")
    parser.add_argument("--skip-steps", action="store_true", help="only the part benchmarks")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "write_path.json")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    every = contenders(args)
    names = [n.strip() for n in args.contenders.split(",") if n.strip()] or list(every)
    unknown = sorted(set(names) - set(every))
    if unknown or "baseline" not in names:
        parser.error(f"choose from {sorted(every)} and include baseline (unknown: {unknown})")

    from cues_platform.spark import get_spark

    spark = get_spark()
    root = Path(tempfile.mkdtemp(prefix="cues-write-path-"))
    started = now_iso()
    loads: list[dict] = []
    cpu = Cpu(spark)
    try:
        data = generate(root, args.rows)
        fx = spark.read.parquet(str(data.fx)).cache()
        fx.count()

        def once(name: str, label: str) -> dict:
            work = Path(tempfile.mkdtemp(prefix=f"wp-{name}-", dir=root))
            settle(spark)
            before = os.getloadavg()[0]
            mark = cpu.now()
            try:
                run = every[name](spark, data, fx, work)
                run.update(cpu.since(mark))
            finally:
                shutil.rmtree(work, ignore_errors=True)
            loads.append({"run": f"{label} {name}", "load1_before": round(before, 2),
                          "load1_after": round(os.getloadavg()[0], 2)})
            print(f"{label} {name}: {run['seconds']:.3f} s cpu {run['cpu_s']} s {run.get('phases', '')} "
                  f"{run.get('inside', '')}",
                  flush=True)
            return run

        rounds = 0 if args.skip_steps else args.rounds
        warmup = {n: round(once(n, "warm-up")["seconds"], 3) for n in names} if rounds else {}
        runs: dict[str, list[dict]] = {n: [] for n in names}
        orders = []
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            orders.append(order)
            for name in order:
                runs[name].append(once(name, f"round {r}"))
        parts = {}
        if args.component_reps:
            parts["write_side"] = write_side(spark, data, fx, cpu, args.component_reps, root)
            parts["spark_side"] = spark_side(spark, data, fx, cpu, args.component_reps, root)
        fx.unpersist()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    result: dict[str, Any] = {
        "benchmark": "write_path", "at": started, "machine": machine_info(), "note": args.note,
        "config": {"rows": args.rows, "rounds": args.rounds, "roll_rows": args.roll_rows,
                   "master": spark.sparkContext.master, "options": "default Options (one backlog step)"},
        "load_average": {"at_start_and_end_of_each_run": loads,
                         "load1_median": median([x["load1_before"] for x in loads]) if loads else None,
                         "cores": os.cpu_count()},
        "warmup_s": warmup, "orders": orders, "contenders": {}, "parts": parts,
    }
    base = runs["baseline"]
    for name, rs in runs.items() if rounds else ():
        secs = [r["seconds"] for r in rs]
        per_round = [round(b["seconds"] / r["seconds"], 4) for b, r in zip(base, rs, strict=True)]
        entry: dict[str, Any] = {"seconds": [round(s, 4) for s in secs], "median_s": round(median(secs), 4),
                                 "speed_vs_baseline_per_round": per_round,
                                 "speed_vs_baseline_median": median(per_round), "steps": rs[-1]["steps"],
                                 "cpu_s_median": median([r["cpu_s"] for r in rs]),
                                 "python_cpu_s_median": median([r["python_cpu_s"] for r in rs]),
                                 "jvm_cpu_s_median": median([r["jvm_cpu_s"] for r in rs]),
                                 "cpu_vs_baseline_median": median([round(r["cpu_s"] / b["cpu_s"], 4)
                                                                   for b, r in zip(base, rs, strict=True)])}
        if "phases" in rs[0]:
            entry["phases_median_s"] = {k: round(median([r["phases"][k] for r in rs]), 4) for k in rs[0]["phases"]}
            entry["check"] = rs[-1]["check"]
        if rs[0].get("inside"):
            entry["inside_median_s"] = {k: round(median([r["inside"][k] for r in rs]), 4) for k in rs[0]["inside"]}
        result["contenders"][name] = entry
    result["breakdown"] = breakdown(result["contenders"]) if rounds else None
    result["notes"] = [
        "speed_vs_baseline = baseline seconds / contender seconds in the same round (> 1: faster).",
        "stream_*: offsets are dense and the step is one commit, but rows are numbered in the order "
        "Spark's partitions FINISH (offsets_follow_input_order says whether that happened to be the "
        "input's order); the product numbers them in partition order.",
        "deltars_writer: the product with every append written by delta-rs' write_deltalake (the "
        "driver path before queues/parallel_files.py); baseline writes a big append's files on "
        "several threads.",
    ]
    for name, c in result["contenders"].items():
        print(f"{name:20} median {c['median_s']:.3f} s  speed vs baseline {c['speed_vs_baseline_median']:.3f} "
              f"per round {c['speed_vs_baseline_per_round']}")
    print(result["breakdown"])
    print("wrote", write_json(args.out, result))


def breakdown(contenders: dict) -> dict:
    """The baseline step's time by part (medians of the rounds)."""
    b = contenders["baseline"]
    ph, inside = b["phases_median_s"], b["inside_median_s"]
    # the product writes a 1M step's files on a thread per core (parallel_files) since 2026-11-29
    write_commit = inside.get("parallel_write_and_commit", inside.get("deltars_write_and_commit", 0.0))
    commit = inside["deltars_commit_only_est"]
    table = {
        "step_total_s": b["median_s"],
        "spark_job_to_arrow_s": inside["spark_job_to_arrow"],
        "conform_s": inside["conform"],
        "metadata_columns_s": inside["metadata_columns"],
        "parquet_write_s (write_and_commit - commit_only_est)": round(write_commit - commit, 4),
        "deltars_commit_s (a zero-row commit on the same queue)": commit,
        "protocol_and_rest_s": round(b["median_s"] - inside["spark_job_to_arrow"] - inside["conform"]
                                     - inside["metadata_columns"] - write_commit, 4),
        "phases_s": ph,
    }
    if "spark_noop" in contenders:
        table["spark_noop_job_s (the Spark work alone, same round medians)"] = contenders["spark_noop"]["median_s"]
    if "spark_batch" in contenders:
        table["spark_batch_s"] = contenders["spark_batch"]["median_s"]
    return table


if __name__ == "__main__":
    main()
