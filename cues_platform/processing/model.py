"""The graph's vocabulary: processors, the queues between them, their bindings and options.

The floor under every other processing module: of the package it imports only the queue layer's
vocabulary (``queues/layout.py``: a queue's offset layout). A processor
binds names to queues: ``inputs={"orders": In("orders")}`` reads every partition of ``orders``
(one lane per partition, ``processing/lanes.py``), ``In("orders", "eu")`` one partition;
``outputs={"out": Out("enriched")}`` writes the lane's partition (``"0"`` outside lanes),
``Out("enriched", "eu")`` one named partition, ``Out("results", partition_column="sender")``
routes rows by a column. Kinds follow Cues: source, map, join, alts, fork, sink, imperative.

:class:`~cues_platform.processing.graph.Graph` (``graph.py``) puts them together; it is validated
by ``validation.py`` and drawn by ``mermaid.py``, which read it through :class:`GraphShape`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import pyarrow as pa

from cues_platform.queues.layout import OffsetLayout

ALL_PARTITIONS = "*"  # In(queue): every partition of the queue (not a legal partition name)
SAME_PARTITION = "="  # Out(queue): the lane's partition ("0" outside lanes)
DEFAULT_PARTITION = "0"


class Kind(StrEnum):
    SOURCE = "source"
    MAP = "map"
    JOIN = "join"
    ALTS = "alts"
    FORK = "fork"
    SINK = "sink"
    IMPERATIVE = "imperative"


class Strategy(StrEnum):
    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"
    AT_MOST_ONCE = "at_most_once"


class SnapshotAt(StrEnum):
    """When an exactly_once step records its snapshot (its input ranges and delivery hash).

    ``commit``: with its output, in the step's one home commit (the default for every kind but a
    sink): a step that crashed before its commit left nothing, and the restart plans it again,
    possibly over longer ranges under another hash. ``read``: in the backing queue before the
    function runs (always for a sink): a restart retries exactly that snapshot with the same hash.
    Choose ``read`` for a map/join/alts/fork whose function has effects outside its outputs keyed
    by ``ctx.delivery_hash`` (a database write with ``postgres_once``): the retry must present
    the same hash so that the effect is recognised as done."""

    COMMIT = "commit"
    READ = "read"


class OutputWriter(StrEnum):
    """Who writes a step's output rows (``processing/executor_output.py``).

    ``executors``: Spark's executors write the Parquet files, with offsets and the other metadata
    columns computed in Spark, and the driver commits them by reference (it reads only their
    footers): no row crosses the driver. ``driver``: the result is collected to the driver as
    Arrow, conformed and written there. ``auto`` (default): executors for a step that reads more
    than ``AUTO_EXECUTOR_ROWS`` (1,000,000) input rows, the driver up to that (measured on two
    local cores, the driver's Arrow + delta-rs write is faster; above it the driver's memory
    would grow with the step). Either way the result is the same
    rows, offsets and commit; a step whose output cannot be written by the executors (not a Spark
    DataFrame, several outputs, a partition column, a pandera contract, column types other than
    the queue's) is written by the driver."""

    AUTO = "auto"
    EXECUTORS = "executors"
    DRIVER = "driver"


class OnError(StrEnum):
    """What a step does when the processor function raises a handled error (its own exception,
    from the driver or from a row on an executor) and the processor has an error queue
    (``processing/isolation.py``).

    ``isolate`` (default): find the input rows the function fails on by splitting the step's input
    range in halves (the streaming side of a join, the chosen input of an alts), deliver the rows
    it does not fail on, and write one error row per failing input row; at most
    ``Options.max_isolation_calls`` extra calls, after which the rows of a range still failing get
    an error row each without further splitting. ``whole_step``: the step's output is one error
    row naming its input ranges (the behaviour before isolation). A sink always behaves as
    ``whole_step`` (its function has effects: see the module)."""

    ISOLATE = "isolate"
    WHOLE_STEP = "whole_step"


class ReadAs(StrEnum):
    """What a processor function gets for each input binding (``processing/inputs.py``).

    ``spark`` (default): a Spark DataFrame over the step's range (lazy; Spark reads the Parquet
    files itself, nothing crosses the driver). ``arrow``: a ``pyarrow.Table`` of the step's rows,
    read by the driver from the same files (pyarrow, no Spark job): for small steps whose
    function works row by row in Python, where a Spark job's fixed cost dominates the step
    (``bench/results/participants.json``: the postings consumer). The rows, their order (by
    offset), the metadata columns and the delivery contract are the same either way; an Arrow
    step holds its whole input in the driver's memory, so keep ``max_batch_size`` small. A
    runner whose processors all read Arrow starts no Spark session (``ctx.spark`` is then None
    unless one is passed to the runner)."""

    SPARK = "spark"
    ARROW = "arrow"


class AssetBody(StrEnum):
    """What a processor's Dagster asset runs (``cues_platform.dagster``); ``cues run`` ignores it.

    ``runner``: the platform's runner (recovery, then steps until the inputs are drained or a
    bound of the run config is hit), the function called once per step inside it.
    ``function``: the asset body IS the processor function, called once per materialization
    (``@processor_asset``): the step IO manager loads the inputs as the step's queue ranges and
    delivers the returned frame with the step's delivery hash. One materialization, one step."""

    RUNNER = "runner"
    FUNCTION = "function"


@dataclass(frozen=True)
class QueueDef:
    name: str
    schema: pa.Schema
    partitions: tuple[str, ...] = ("0",)
    contract: Any = None  # pandera: pandas (row by row in the step) or pyspark (the Dagster check)
    # how the queue's files hold offsets, fixed when it is created (queues/layout.py): ``based``
    # lets a large step's output be written by Spark's executors in one job
    offset_layout: OffsetLayout = OffsetLayout.ABSOLUTE


@dataclass(frozen=True)
class In:
    queue: str
    partition: str = ALL_PARTITIONS  # default: every partition, one lane each (processing/lanes.py)


@dataclass(frozen=True)
class Out:
    queue: str
    partition: str | None = SAME_PARTITION  # default: the lane's partition ("0" outside lanes)
    partition_column: str | None = None  # route each row by this payload column instead


@dataclass(frozen=True)
class Options:
    batch_size: int = 10_000
    # a processor more than 10 x batch_size behind reads up to this many offsets per step
    # (processing/batching.py); set it to batch_size for fixed-size steps
    max_batch_size: int = 1_000_000
    poll_interval: float = 0.5
    strategy: Strategy = Strategy.EXACTLY_ONCE
    snapshot_at: SnapshotAt = SnapshotAt.COMMIT  # exactly_once; a sink always records at read
    output_writer: OutputWriter = OutputWriter.AUTO
    backing_maintenance_every: int = 1_000  # steps between backing-queue compactions; 0: never
    # lanes (one per partition of an every-partition input) of a map, join, alts or fork that step
    # at the same time in one runner (threads; Spark runs their jobs side by side); 1: in turn.
    # bench/results/lanes.json (c0d492e; 2 cores, 2,000-row steps): lanes at once 1.16x the
    # throughput of in turn with 2 lanes, 1.36x with 4 (2.1x / 1.9x on a loaded machine, b114092)
    lane_workers: int = 4
    # a handled error: isolate the failing rows (default) or fail the whole step (processing/isolation.py)
    on_error: OnError = OnError.ISOLATE
    # extra function calls one step's isolation may make: k failing rows of n cost about
    # 2 k log2(n / k) calls; past the bound, the rows of ranges still failing get an error row each.
    # None (default): 32 per halving of the step, 32 * ceil(log2 n) (640 for a 1M-offset step:
    # room for about 16 failing rows), so a function failing on every row stops that early too
    max_isolation_calls: int | None = None
    # the calls of one level of isolation's search run at once from this many driver threads
    # (the function must accept concurrent calls, as it does with lane_workers); 1: one at a time.
    # What isolation finds does not depend on it (bench/results/isolation.json: 4 threads 40x the
    # clean backlog against 65x one at a time, 10 bad rows in 1M, loaded machine)
    isolation_workers: int = 4
    # the inputs as Spark DataFrames (default) or as pyarrow Tables read by the driver (ReadAs)
    read_as: ReadAs = ReadAs.SPARK


@dataclass(frozen=True)
class Processor:
    id: str
    kind: Kind
    fn: Callable[..., Any]
    inputs: Mapping[str, In] = field(default_factory=dict)
    outputs: Mapping[str, Out] = field(default_factory=dict)
    error_queue: str | None = None
    options: Options = field(default_factory=Options)
    description: str = ""
    asset_body: AssetBody = AssetBody.RUNNER
    family: str | None = None  # set by Graph.build: the id the user gave (a lane's processor)
    lane: str | None = None  # set by Graph.build: the partition this lane reads (None: no lanes)

    @property
    def strategy(self) -> Strategy:
        return self.options.strategy

    @property
    def doc(self) -> str:
        return self.description or inspect.getdoc(self.fn) or ""


class GraphShape(Protocol):
    """What validation (``validation.py``) and rendering (``mermaid.py``) read of a graph: the
    :class:`~cues_platform.processing.graph.Graph` above them, without importing it."""

    @property
    def name(self) -> str: ...

    @property
    def queues(self) -> Mapping[str, QueueDef]: ...

    @property
    def processors(self) -> Mapping[str, Processor]: ...

    @property
    def error_queue(self) -> str | None: ...

    @property
    def families(self) -> dict[str, list[str]]: ...

    def error_queue_of(self, processor: Processor) -> str | None: ...

    def topological_order(self) -> list[str]: ...
