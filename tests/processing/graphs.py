"""Factories of small test graphs (one per processor kind) and exact checks of their results.

Every graph has one processor ``p`` of the given kind reading pre-loaded input queues:

- map:  ``a -> p -> b``
- join: ``a, c -> p -> b`` (waits for both; each step reads one block of each)
- alts: ``a, c -> p -> b`` (each step reads one block of ONE input)
- fork: ``a -> p -> b, d`` (``left`` writes ``id * 2`` to b, ``right`` writes ``id * 3`` to d)
- sink: ``a -> p`` whose side effect is a Delta table written through
  :func:`cues_platform.processing.sinks.write_delta_once` (keyed by the step, with the delivery
  hash in a column), so every effect must be there exactly once.

Input ``a`` holds ids ``0..n-1`` and ``c`` ids ``100..100+n-1``; with ``batch`` rows per step the
inputs split into aligned blocks. The ``outcome`` switch applies to the rows of block 1 of every
input (the other blocks always produce output):

- ``output``: block 1 is processed like any other;
- ``error``: the function raises (the graph has an error queue, unless ``error_queue=False``);
- ``nil``: the function returns None (for a sink: performs no side effect).

``expected(kind, outcome)`` gives the exact final contents; ``check_exact`` compares them with the
lake, the backing queue's history and (for a sink) the side-effect table.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import functions as F

from cues_platform.processing import (
    ERROR_SCHEMA,
    Graph,
    In,
    Kind,
    Options,
    Out,
    OutputWriter,
    Processor,
    QueueDef,
    ReadAs,
    RecordType,
    SimulatedCrash,
    Strategy,
)
from cues_platform.processing.history import processor_history
from cues_platform.queues import Lake, OffsetLayout
from tests.support import PAYLOAD, rows

KINDS = ("map", "join", "alts", "fork", "sink")
OUTCOMES = ("output", "error", "nil")
N, BATCH = 30, 10
C_BASE = 100
PID = "p"
SINK_TABLE = "sink_effects"
# Crash points of a step, in protocol order ("between_commits" exists only for a fork).
STEP_POINTS = ("before_snapshot", "after_snapshot", "after_read", "after_function",
               "after_prepare", "after_attempt", "between_commits", "after_commit")


class Boom(ValueError):
    """What a failing test function raises."""


def sink_uri(lake: Lake) -> str:
    return lake.root.rstrip("/") + "/" + SINK_TABLE


def _special(ctx: Any, batch: int) -> bool:
    """True when this step reads block 1 of an input (the block the outcome switch applies to).
    Decided from the step's input ranges, so no Spark job is needed."""
    return any(r.size and r.start // batch == 1 for r in ctx.inputs.values())


def make_fn(kind: str, outcome: str, *, batch: int = BATCH,
            fail: Callable[[Any], bool] | None = None) -> Callable[..., Any]:
    """The processor function of ``kind`` with the ``outcome`` switch on block 1."""

    def switch(ctx: Any, frames: list[Any]) -> str:
        special = _special(ctx, batch) if fail is None else fail(ctx)
        if not special or outcome == "output":
            return "output"
        if outcome == "error":
            raise Boom(f"step {ctx.step} of {ctx.processor_id} fails on purpose")
        return "nil"

    def doubled(*frames: Any) -> Any:
        out = None
        for f in frames:
            d = f.select((F.col("id") * 2).alias("id"), F.col("note"))
            out = d if out is None else out.unionByName(d)
        return out

    if kind == "map":
        def fn(ctx, src):
            return doubled(src) if switch(ctx, [src]) == "output" else None
    elif kind in ("join", "alts"):
        def fn(ctx, left, right):
            return doubled(left, right) if switch(ctx, [left, right]) == "output" else None
    elif kind == "fork":
        def fn(ctx, src):
            if switch(ctx, [src]) != "output":
                return None
            return {"left": doubled(src),
                    "right": src.select((F.col("id") * 3).alias("id"), F.col("note"))}
    elif kind == "sink":
        def fn(ctx, src):
            from cues_platform.processing.sinks import write_delta_once

            if switch(ctx, [src]) == "output":
                data = doubled(src).toArrow()
                write_delta_once(ctx, table_uri=sink_uri(ctx.lake), data=data, hash_column="hash")
            return None
    else:  # pragma: no cover - a typo in a test
        raise ValueError(kind)
    return fn


def build_graph(kind: str, outcome: str = "output", *, batch: int = BATCH, error_queue: bool = True,
                strategy: Strategy = Strategy.EXACTLY_ONCE, fn: Callable[..., Any] | None = None,
                name: str = "g", read_as: ReadAs = ReadAs.SPARK,
                writer: OutputWriter = OutputWriter.AUTO,
                offset_layout: OffsetLayout = OffsetLayout.ABSOLUTE) -> Graph:
    """``offset_layout``: how every queue of the graph holds offsets (queues/based.py)."""
    queues = [QueueDef(n, PAYLOAD, offset_layout=offset_layout) for n in ("a", "b", "c", "d")]
    if error_queue:
        queues.append(QueueDef("errors", ERROR_SCHEMA, offset_layout=offset_layout))
    fn = fn or make_fn(kind, outcome, batch=batch)
    k = Kind(kind)
    inputs: dict[str, In] = {"src": In("a")}
    outputs: dict[str, Out] = {"out": Out("b")}
    if kind in ("join", "alts"):
        inputs = {"left": In("a"), "right": In("c")}
    if kind == "fork":
        outputs = {"left": Out("b"), "right": Out("d")}
    if kind == "sink":
        outputs = {}
    proc = Processor(PID, k, fn, inputs, outputs,
                     options=Options(batch_size=batch, max_batch_size=batch, strategy=strategy,
                                     read_as=read_as, output_writer=writer))
    return Graph.build(name=name, queues=queues, processors=[proc],
                       error_queue="errors" if error_queue else None)


def variant_options(variant: str = "") -> dict[str, Any]:
    """``build_graph`` options by name: "" the defaults; "based-executors": every queue with
    based offsets and the output written by Spark's executors in one job (queues/based.py)."""
    if variant == "based-executors":
        return {"writer": OutputWriter.EXECUTORS, "offset_layout": OffsetLayout.BASED}
    if variant:  # pragma: no cover - a typo in a test
        raise ValueError(variant)
    return {}


LANE_SHIFT = 1_000  # ids of partition "x" of the lanes graph: the same rows, shifted


def build_lanes_graph(kind: str, outcome: str = "output", *, batch: int = BATCH) -> Graph:
    """``build_graph``'s processor over every partition of queues with partitions "0" and "x":
    lanes ``p`` and ``p.x`` (processing/lanes.py)."""
    one = build_graph(kind, outcome, batch=batch)
    queues = [q if q.name == "errors" else QueueDef(q.name, q.schema, ("0", "x")) for q in one.queues.values()]
    return Graph.build(name=one.name, queues=queues, processors=list(one.declared), error_queue="errors")


def load_lane_inputs(lake: Lake, kind: str, n: int = N) -> None:
    load_inputs(lake, kind, n)
    lake.queue("a").append(rows(LANE_SHIFT, n), partition="x")
    if kind in ("join", "alts"):
        lake.queue("c").append(rows(LANE_SHIFT + C_BASE, n), partition="x")


def check_lanes_exact(lake: Lake, kind: str, outcome: str) -> None:
    """``check_exact`` for each lane of ``build_lanes_graph``, and the sink's effects of both."""
    ex = expected(kind, outcome)
    sink = None if ex.sink is None else sorted([*ex.sink, *(i + 2 * LANE_SHIFT for i in ex.sink)])
    check_exact(lake, kind, outcome, sink_ids=sink)
    check_exact(lake, kind, outcome, pid=f"{PID}.x", partition="x", shift=LANE_SHIFT, sink_ids=sink)


def load_inputs(lake: Lake, kind: str, n: int = N) -> None:
    """Append the inputs (queues must exist: create a GraphRunner first or call create_queues)."""
    lake.queue("a").append(rows(0, n), partition="0")
    if kind in ("join", "alts"):
        lake.queue("c").append(rows(C_BASE, n), partition="0")


# -- expectations --------------------------------------------------------------------------------
@dataclass
class Expected:
    queues: dict[str, list[int]] = field(default_factory=dict)  # queue -> sorted ids
    sink: list[int] | None = None
    errors: int = 0
    error_inputs: list[tuple[str, int, int]] = field(default_factory=list)  # (queue, start, end)
    # error rows of a failed step: one per row of its block (isolation), one for a sink's step
    error_rows_per_step: int = 1


def expected(kind: str, outcome: str, *, n: int = N, batch: int = BATCH) -> Expected:
    inputs = {"a": list(range(n))}
    if kind in ("join", "alts"):
        inputs["c"] = list(range(C_BASE, C_BASE + n))
    kept = {q: [i for i in ids if outcome == "output" or (i % C_BASE) // batch != 1]
            for q, ids in inputs.items()}
    ex = Expected()
    if outcome == "error":
        ex.errors = 2 if kind == "alts" else 1
        block = range(batch, 2 * batch)
        if kind == "sink":  # not isolated: one error row naming the step's ranges
            ex.error_inputs = [("a", batch, 2 * batch)]
        elif kind == "alts":  # isolated on the chosen input: one error row per row of its block
            ex.error_inputs = [(q, o, o + 1) for q in ("a", "c") for o in block]
        else:  # isolated on "a" (a join: the first of its equal-sized inputs), "c" given whole
            ex.error_inputs = [("a", o, o + 1) for o in block]
            if kind == "join":
                ex.error_inputs += [("c", batch, 2 * batch)] * batch
        ex.error_rows_per_step = 1 if kind == "sink" else batch
    doubled = sorted(i * 2 for ids in kept.values() for i in ids)
    if kind == "fork":
        ex.queues = {"b": doubled, "d": sorted(i * 3 for i in kept["a"])}
    elif kind == "sink":
        ex.sink = doubled
        ex.queues = {"b": []}
    else:
        ex.queues = {"b": doubled}
    return ex


def ids_of(lake: Lake, queue: str, partition: str = "0") -> list[int]:
    return sorted(lake.queue(queue).read_arrow(partition=partition)["id"].to_pylist())


def sink_rows(lake: Lake) -> pa.Table | None:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(sink_uri(lake)).to_pyarrow_table()
    except TableNotFoundError:
        return None


def check_backing(lake: Lake, pid: str = PID, *, kind: str | None = None) -> dict[int, Any]:
    """The step history (backing records merged with the one-commit steps' home commits) has one
    attempt per step 0..k, in order, and ends with a delivered attempt. A sink records
    [snapshot, attempt] per step (a retry reuses its snapshot); other kinds record no snapshot
    (it is folded into the attempt or the home commit). Returns step -> attempt."""
    records = processor_history(lake, pid)
    assert records, "no step records"
    assert records[-1].is_attempt, f"last record is {records[-1].type}, not an attempt"
    attempts = [r for r in records if r.is_attempt]
    assert [a.step for a in attempts] == list(range(len(attempts))), \
        f"attempts are not one per step 0..k: {[a.step for a in attempts]}"
    snapshots = [(i, r) for i, r in enumerate(records) if r.type is RecordType.SNAPSHOT]
    if kind is not None and kind != "sink":
        assert not snapshots, f"a {kind} records no snapshot of its own: {snapshots}"
    if kind == "sink":
        types = [(r.type is RecordType.SNAPSHOT, r.step) for r in records]
        assert types == [(i % 2 == 0, i // 2) for i in range(len(records))], \
            f"a sink's backing history is not [snapshot, attempt] per step: {types}"
    for i, snap in snapshots:
        att = records[i + 1]
        assert att.is_attempt and snap.hash == att.hash and snap.snapshot == att.snapshot
    return {a.step: a for a in attempts}


# the factor a kind's function applies to ids, per output queue (shifted inputs shift by it)
FACTOR = {"b": 2, "d": 3}


def check_exact(lake: Lake, kind: str, outcome: str, *, n: int = N, batch: int = BATCH,
                pid: str = PID, legacy: bool = False, partition: str = "0", shift: int = 0,
                sink_ids: list[int] | None = None) -> dict[int, Any]:
    """Exact contents: outputs, errors, side effects, and their hashes against the step history
    (``legacy``: its first steps were written by the previous protocol, with snapshot records).
    Lanes (``partition``, ``pid`` the lane, ``shift`` added to its input ids): the lane's output
    partition and its own error rows; ``sink_ids`` every lane's side effects together."""
    ex = expected(kind, outcome, n=n, batch=batch)
    attempts = check_backing(lake, pid, kind=None if legacy else kind)
    for q, ids in ex.queues.items():
        want = [i + FACTOR.get(q, 1) * shift for i in ids]
        assert ids_of(lake, q, partition) == want, f"queue {q!r}/{partition} differs from the expected rows"
    # Every output row carries the hash of a step whose attempt says it wrote that many rows there.
    for q in ex.queues:
        table = lake.queue(q).read_arrow(partition=partition)
        per_hash = Counter(table["_delivery_hash"].to_pylist())
        by_hash = {a.hash: a for a in attempts.values()}
        for h, count in per_hash.items():
            att = by_hash[h]
            assert att.type is RecordType.ATTEMPT_OUTPUT
            assert sum(att.outputs["rows"][q].values()) == count
    # Errors: one row per failing input row (isolation; a sink: one per failed step), with the
    # processor, step, hash of that step and the row's one-offset range (a sink: the step's ranges).
    err_attempts = sorted((a for a in attempts.values() if a.type is RecordType.ATTEMPT_ERROR),
                          key=lambda a: a.step)
    assert len(err_attempts) == ex.errors
    if lake.has_queue("errors"):
        errors = [e for e in lake.queue("errors").read_arrow(partition="0").to_pylist()
                  if e["processor"] == pid]
        got = sorted((e["processor"], e["step"], e["_delivery_hash"]) for e in errors)
        assert got == [(pid, a.step, a.hash) for a in err_attempts for _ in range(ex.error_rows_per_step)]
        spans = sorted((q, s, e) for row in errors for (q, _p, s, e) in json.loads(row["inputs"]).values()
                       if e > s)
        assert spans == sorted(ex.error_inputs)
        assert all(e["exception_type"].endswith("Boom") for e in errors)
    # Sink side effects: exactly once, each tagged with the hash of the step that made it.
    if ex.sink is not None:
        table = sink_rows(lake)
        got_ids = [] if table is None else sorted(table["id"].to_pylist())
        assert got_ids == (ex.sink if sink_ids is None else sink_ids), "sink side effects are not exactly once"
        if table is not None and sink_ids is None:
            hashes = {a.hash for a in attempts.values() if a.type is RecordType.ATTEMPT_NIL}
            assert set(table["hash"].to_pylist()) <= hashes
    # Nothing staged is left behind once the steps are delivered.
    staging = lake.local_path(lake.system_uri("staging", pid))
    assert not staging.exists() or not any(staging.iterdir())
    return attempts


# -- crash hooks ---------------------------------------------------------------------------------
class CrashAt:
    """A hook that crashes at the ``occurrence``-th time (1-based) ``point`` is reached.

    With one processor, occurrence k+1 of a step point is step k. ``how`` is ``"raise"``
    (SimulatedCrash, in-process) or ``"kill"`` (SIGKILL of this process)."""

    def __init__(self, point: str, occurrence: int = 2, how: str = "raise") -> None:
        self.point, self.occurrence, self.how = point, occurrence, how
        self.seen: Counter[str] = Counter()
        self.fired = False

    def __call__(self, point: str) -> None:
        self.seen[point] += 1
        if point == self.point and self.seen[point] == self.occurrence and not self.fired:
            self.fired = True
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise SimulatedCrash(f"crash at {point} #{self.occurrence}")


def random_fork_fn() -> Callable[..., Any]:
    """A non-deterministic fork: both outputs carry the same random numbers, drawn per call."""

    def fn(ctx, src):
        ids = [r["id"] for r in src.select("id").collect()]
        nonce = random.randrange(1, 1_000_000)
        table = pa.table({"id": pa.array([i * 1_000_000 + nonce for i in ids], pa.int64()),
                          "note": [f"r{ctx.step}" for _ in ids]})
        return {"left": table, "right": table}

    return fn


CHILD = """
import sys
from cues_platform.processing import GraphRunner
from cues_platform.queues import Lake
from tests.processing.graphs import CrashAt, build_graph, variant_options
root, kind, outcome, point, occurrence = sys.argv[1:6]
variant = sys.argv[6] if len(sys.argv) > 6 else ""
lake = Lake(root=root)
runner = GraphRunner(graph=build_graph(kind, outcome, **variant_options(variant)), lake=lake,
                     hook=CrashAt(point, int(occurrence), "kill"))
runner.run_until_idle()
print("NOT KILLED")
"""


# -- the soak graph: map -> fork -> sink ---------------------------------------------------------
SOAK_PIDS = ("m", "f", "s")


def build_soak_graph(batch: int) -> Graph:
    """``a -m-> b -f-> (c, d)``, ``d -s-> sink table``: ids x2 in b, x2+1 in c, x2 in d and the sink."""

    def m(ctx, src):
        return src.select((F.col("id") * 2).alias("id"), F.col("note"))

    def f(ctx, src):
        return {"odd": src.select((F.col("id") + 1).alias("id"), F.col("note")),
                "even": src.select("id", "note")}

    def s(ctx, src):
        from cues_platform.processing.sinks import write_delta_once

        write_delta_once(ctx, table_uri=sink_uri(ctx.lake), data=src.select("id").toArrow(),
                         hash_column="hash")

    opts = Options(batch_size=batch, max_batch_size=batch)  # fixed-size steps: many kill points
    return Graph.build(
        name="soak",
        queues=[QueueDef(q, PAYLOAD) for q in ("a", "b", "c", "d")] + [QueueDef("errors", ERROR_SCHEMA)],
        processors=[
            Processor("m", Kind.MAP, m, {"src": In("a")}, {"out": Out("b")}, options=opts),
            Processor("f", Kind.FORK, f, {"src": In("b")}, {"odd": Out("c"), "even": Out("d")}, options=opts),
            Processor("s", Kind.SINK, s, {"src": In("d")}, {}, options=opts),
        ],
        error_queue="errors")


SOAK_CHILD = """
import sys
from cues_platform.processing import GraphRunner
from cues_platform.queues import Lake
from tests.processing.graphs import build_soak_graph
root, batch = sys.argv[1], int(sys.argv[2])
GraphRunner(graph=build_soak_graph(batch), lake=Lake(root=root), keep_results=False).run_until_idle()
print("DONE", flush=True)
"""


SOAK_HOMES = {"m": "b", "f": "c"}  # each processor's home queue (its first output); s has none


def backing_progress(lake: Lake, pids: tuple[str, ...] = SOAK_PIDS) -> int:
    """A cheap progress gauge: backing records written (a fork's attempts, a sink's snapshots and
    attempts) plus steps delivered to the home queues (``proc:{p}`` + 1). When every step of the
    soak graph is done it is ``SOAK_UNITS_PER_STEP`` per step."""
    total = 0
    for pid in pids:
        uri = lake.system_uri("backing", pid)
        if lake.local_path(uri).joinpath("_delta_log").exists():
            total += lake.queue(pid, uri=uri).next_offset("0")
        home = SOAK_HOMES.get(pid)
        if home is not None and lake.has_queue(home):
            version = lake.queue(home).refresh().transaction_version(f"proc:{pid}")
            total += 0 if version is None else int(version) + 1
    return total


SOAK_UNITS_PER_STEP = 1 + 2 + 2  # m: its home commit; f: attempt + home commit; s: snapshot + attempt
