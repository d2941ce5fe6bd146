"""Running a graph: recovery, then steps, in one process.

``GraphRunner.run_until_idle`` is what a Dagster materialization and the tests use; ``run`` is
the continuous runner of ``cues run``: it polls each processor's inputs with exponential backoff
(up to the processor's ``poll_interval``), stops gracefully on SIGTERM / Ctrl-C (the step in
flight finishes or, if killed, is recovered on the next start) and shows progress with rich.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from cues_platform.processing.backing import BackingOf
from cues_platform.processing.deployments import check_and_record
from cues_platform.processing.errors import GraphError, ProcessorFencedError
from cues_platform.processing.events import EventSink, step_fields
from cues_platform.processing.graph import Graph
from cues_platform.processing.lanes import (
    ALL_PARTITIONS,
    LANE_REFRESH_SECONDS,
    SAME_PARTITION,
)
from cues_platform.processing.model import Kind, Processor, ReadAs
from cues_platform.processing.sources import SourceStepper, is_source_like
from cues_platform.processing.step import Hook, StepBase, StepResult
from cues_platform.processing.strategies import make_stepper
from cues_platform.queues import Lake
from cues_platform.signals import StopSignals
from cues_platform.spark import get_spark


@dataclass
class ProcessorStats:
    steps: int = 0
    rows_in: int = 0
    rows_out: int = 0
    errors: int = 0
    recovered: int = 0
    last: StepResult | None = None
    results: list[StepResult] = field(default_factory=list)

    def add(self, result: StepResult, *, keep: bool) -> None:
        self.steps += 1
        self.rows_in += result.rows_in
        self.rows_out += sum(result.rows_out.values())
        self.errors += result.outcome == "error"
        self.recovered += result.recovered
        self.last = result
        if keep:
            self.results.append(result)


def create_queues(graph: Graph, lake: Lake) -> None:
    for q in graph.queues.values():
        lake.create_queue(q.name, schema=q.schema, partitions=q.partitions, exist_ok=True,
                          offset_layout=q.offset_layout)


def needs_spark(graph: Graph, only: list[str] | None) -> bool:
    """False when every processor the runner steps reads its inputs as Arrow (``ReadAs.ARROW``):
    such a runner starts no Spark session (a JVM the process would otherwise keep for nothing)."""
    chosen = [p for pid, p in graph.processors.items()
              if only is None or pid in only or p.family in only]
    return not chosen or any(p.options.read_as is not ReadAs.ARROW for p in chosen)


class GraphRunner:
    def __init__(self, *, graph: Graph, lake: Lake, spark: Any = None,
                 resources: Mapping[str, Any] | None = None, hook: Hook | None = None,
                 only: list[str] | None = None, keep_results: bool = True,
                 events: EventSink | None = None,
                 lane_refresh: float = LANE_REFRESH_SECONDS, backing_of: BackingOf | None = None) -> None:
        self.graph, self.lake, self.keep_results = graph, lake, keep_results
        # what the runner does, event by event (processing/events.py); None: nothing emitted
        self.events: EventSink = events or (lambda _event, _fields: None)
        # a changed graph is continued exactly once or refused here, before any step (and before
        # its new queues are created: a refused graph leaves nothing behind)
        check_and_record(graph, lake, only=None if only is None else [
            pid for pid, p in graph.processors.items() if pid in only or p.family in only])
        create_queues(graph, lake)
        if spark is None and needs_spark(graph, only):
            spark = get_spark()
        self._spark, self._resources, self._hook, self._only = spark, resources, hook, only
        # where each lane's backing queue is reached (the Dagster ``backing`` resource), else the lake
        self._backing_of = backing_of
        self.steppers: dict[str, StepBase] = {}
        self.stats: dict[str, ProcessorStats] = {}
        self._needs_recovery: set[str] = set()
        self._lanes_checked = 0.0
        self.lane_refresh = lane_refresh  # seconds between two refresh_lanes of run()
        self._lanes_waiting: set[tuple[str, str, str]] = set()  # (family, queue, partition) announced
        self._lanes_refused: set[str] = set()  # lane_refused reasons announced
        self._add_steppers(graph)
        self.stop_event = threading.Event()
        self._recovered = False

    def _add_steppers(self, graph: Graph) -> None:
        """Steppers for the processors (lanes) of ``graph`` this runner has none for yet, kept in
        topological order; ``only`` names processors or lanes."""
        steppers: dict[str, StepBase] = {}
        for pid in graph.topological_order():
            proc = graph.processors[pid]
            if self._only is not None and pid not in self._only and proc.family not in self._only:
                continue
            if pid in self.steppers:
                steppers[pid] = self.steppers[pid]
                continue
            kwargs = dict(graph=graph, processor=proc, lake=self.lake, spark=self._spark,
                          resources=self._resources, hook=self._hook, backing_of=self._backing_of)
            steppers[pid] = SourceStepper(**kwargs) if is_source_like(proc.kind) else make_stepper(**kwargs)
            self.stats[pid] = ProcessorStats()
            self._needs_recovery.add(pid)
        self.graph, self.steppers = graph, steppers

    def refresh_lanes(self, *, every: float = 0.0) -> list[str]:
        """Lanes for partitions added to the queues of every-partition bindings since the graph
        was built (``Queue.add_partitions``; processing/lanes.py); at most once per ``every``
        seconds. Returns the ids of the lanes added.

        A partition added to one input of a processor that reads several queues partition by
        partition (a join of ``a`` and ``b`` binds partition p of each) is held back until every
        such input has it: the runner keeps stepping its lanes and emits ``lane_waiting`` once
        (the partition, its queue, the queues it waits for), then ``lane_added`` when the last one
        gains it. While held back, the partition gets no lane of any processor (the graph's
        partitions are per queue). A graph the lake's partitions cannot be expanded into for
        another reason keeps the lanes it has and emits ``lane_refused`` once per reason."""
        now = time.monotonic()
        if now - self._lanes_checked < every:
            return []
        self._lanes_checked = now
        partitions = self._ready_partitions()
        try:
            graph = self.graph.with_lake_partitions(partitions)
        except GraphError as exc:
            reason = str(exc).splitlines()[0]
            if reason not in self._lanes_refused:
                self._lanes_refused.add(reason)
                self.events("lane_refused", {"error": reason[:500]})
            return []
        if graph is self.graph:
            return []
        new = [pid for pid, p in graph.processors.items() if pid not in self.graph.processors
               and (self._only is None or pid in self._only or p.family in self._only)]
        try:  # a new lane reading what another of its family read is refused (deployments.py)
            check_and_record(graph, self.lake, only=new)
        except GraphError as exc:
            reason = str(exc).splitlines()[0]
            if reason not in self._lanes_refused:
                self._lanes_refused.add(reason)
                self.events("lane_refused", {"error": f"{type(exc).__name__}: {reason}"[:500]})
            return []
        create_queues(graph, self.lake)
        before = set(self.steppers)
        self._add_steppers(graph)
        added = [pid for pid in self.steppers if pid not in before]
        for pid in added:
            self.events("lane_added", {"processor": pid, "family": graph.processors[pid].family,
                                       "partition": graph.processors[pid].lane})
        return added

    def _ready_partitions(self) -> dict[str, tuple[str, ...]]:
        """``{queue: partitions}`` for :meth:`Graph.with_lake_partitions`: the lake's partitions
        of the queues read by every-partition bindings, less those held back because another
        co-partitioned input of the same processor lacks them (to a fixpoint: holding one back
        can hold it back elsewhere), and the outputs written partition by partition, which gain
        the ready partitions of their inputs (as ``Out(queue)`` promises: "the lane's
        partition"; existing partitions are never touched)."""
        bindings: list[tuple[Processor, list[str]]] = []
        lake_parts: dict[str, tuple[str, ...]] = {}
        for p in self.graph.declared:
            read_whole = list(dict.fromkeys(i.queue for i in p.inputs.values()
                                            if i.partition == ALL_PARTITIONS))
            if read_whole:
                bindings.append((p, read_whole))
                for q in read_whole:
                    if q not in lake_parts:
                        lake_parts[q] = self.lake.queue(q).partitions
        ready = {q: list(parts) for q, parts in lake_parts.items()}
        waits: dict[tuple[str, str, str], list[str]] = {}
        changed = True
        while changed:
            changed = False
            for p, read_whole in bindings:
                for q in read_whole:
                    known = self.graph.queues[q].partitions if q in self.graph.queues else ()
                    for part in list(ready[q]):
                        lacking = [r for r in read_whole if part not in ready[r]]
                        if part in known or not lacking:
                            continue
                        ready[q].remove(part)
                        waits[(p.id, q, part)] = lacking
                        changed = True
        for (family, q, part), lacking in waits.items():
            if (family, q, part) not in self._lanes_waiting:
                self._lanes_waiting.add((family, q, part))
                self.events("lane_waiting", {
                    "family": family, "queue": q, "partition": part, "waits_for": lacking,
                    "message": f"partition {part!r} of queue {q!r} waits for its co-partition in "
                               f"queue {', '.join(map(repr, lacking))} (processor {family!r} reads "
                               "them partition by partition); its lanes start once "
                               f"{'they have' if len(lacking) > 1 else 'it has'} partition {part!r} "
                               "(Queue.add_partitions)"})
        partitions: dict[str, tuple[str, ...]] = {q: tuple(parts) for q, parts in ready.items()}
        for p, read_whole in bindings:
            for o in p.outputs.values():
                if o.partition == SAME_PARTITION and o.partition_column is None:
                    out = self.lake.queue(o.queue)
                    missing = list(dict.fromkeys(x for q in read_whole for x in ready[q]
                                                 if x not in out.partitions))
                    if missing:
                        out.add_partitions(missing)
                    held = {part for (_, q, part) in waits if q == o.queue}
                    partitions[o.queue] = tuple(x for x in out.partitions if x not in held)
        return partitions

    def recover(self, pids: list[str] | None = None) -> None:
        for pid in pids or list(self.steppers):
            stepper = self.steppers[pid]
            result = self._fenced_guard(pid, stepper.recover)
            self._needs_recovery.discard(pid)
            if result is not None:
                self.stats[pid].add(result, keep=self.keep_results)
            self.events("recovered", {
                "processor": pid,
                "rolled_forward": None if result is None else {"step": result.step,
                                                               "delivery_hash": result.delivery_hash},
                "next_step": getattr(stepper, "next_step", None),
                "positions": dict(getattr(stepper, "positions", {}))})
        self._recovered = not self._needs_recovery

    def step_once(self, pid: str) -> StepResult | None:
        """One step of ``pid``. A step that fails leaves the processor needing recovery: the next
        call recovers it first (fencing, roll-forward) instead of retrying from memory, so a
        half-delivered attempt is never re-prepared by the same runner."""
        if pid in self._needs_recovery:
            self.recover([pid])
        try:
            result = self._fenced_guard(pid, self.steppers[pid].step)
        except BaseException:
            self._needs_recovery.add(pid)
            self._recovered = False
            raise
        if result is not None:
            self.stats[pid].add(result, keep=self.keep_results)
            self.events("step", step_fields(pid, result))
        return result

    def _fenced_guard(self, pid: str, call: Any) -> Any:
        try:
            return call()
        except ProcessorFencedError as exc:
            self.events("fenced", {"processor": pid, "error": str(exc).splitlines()[0][:300]})
            raise

    def step_pass(self, pids: list[str]) -> dict[str, StepResult | None]:
        """One step of each of ``pids`` (upstream first). The lanes of one map, join, alts or fork
        step at the same time, up to its ``Options.lane_workers`` threads (Spark runs their jobs
        side by side; each lane commits on its own), then the pass goes on; a sink's lanes step in
        turn, as their effects go through shared resources. If a lane fails, its siblings'
        steps still finish (each is recorded or not, as on its own) before the error is raised."""
        out: dict[str, StepResult | None] = {}
        i = 0
        while i < len(pids):
            proc = self.graph.processors[pids[i]]
            family = proc.family or proc.id
            group = [pids[i]]
            while i + len(group) < len(pids) and self.graph.processors[pids[i + len(group)]].family == family:
                group.append(pids[i + len(group)])
            i += len(group)
            workers = min(len(group), proc.options.lane_workers)
            if workers <= 1 or proc.kind in (Kind.SINK, Kind.IMPERATIVE, Kind.SOURCE):
                for pid in group:
                    if self.stop_event.is_set():
                        return out
                    out[pid] = self.step_once(pid)
                continue
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"lanes-{family}") as pool:
                futures = {pid: pool.submit(self.step_once, pid) for pid in group}
                wait(list(futures.values()))
            for pid, future in futures.items():
                out[pid] = future.result()  # the first failure, once every lane's step is over
        return out

    def run_until_idle(self, *, max_steps: int | None = None) -> dict[str, ProcessorStats]:
        """Step every processor (upstream first) until none has work or ``max_steps`` is hit
        (with ``max_steps``, one step at a time: lanes in turn)."""
        self.refresh_lanes()
        if self._needs_recovery:
            self.recover([p for p in self.steppers if p in self._needs_recovery])
        total = 0
        while not self.stop_event.is_set():
            progressed = False
            if max_steps is None:
                progressed = any(r is not None for r in self.step_pass(list(self.steppers)).values())
                if not progressed:
                    break
                continue
            for pid in self.steppers:
                if total >= max_steps:
                    return self.stats
                if self.step_once(pid) is not None:
                    progressed, total = True, total + 1
            if not progressed:
                break
        return self.stats

    def run(self, *, show_progress: bool = True, idle_exit: float | None = None) -> dict[str, ProcessorStats]:
        """The continuous runner: until SIGTERM/SIGINT (or ``idle_exit`` seconds with no work)."""
        with StopSignals(lambda _signum: self.stop_event.set()):
            if self._needs_recovery and not self.stop_event.is_set():
                self.recover([p for p in self.steppers if p in self._needs_recovery])
            delays = {pid: 0.01 for pid in self.steppers}
            due = dict.fromkeys(self.steppers, 0.0)
            idle_since = time.monotonic()
            idle = False
            live = _live(self) if show_progress else None
            with live or _nullcontext():
                while not self.stop_event.is_set():
                    for pid in self.refresh_lanes(every=self.lane_refresh):
                        delays[pid], due[pid] = 0.01, 0.0
                    now = time.monotonic()
                    ready = [pid for pid in self.steppers if due[pid] <= now]
                    for pid, result in self.step_pass(ready).items():
                        if result is not None:
                            delays[pid], due[pid], idle_since = 0.01, 0.0, time.monotonic()
                            idle = False
                        else:
                            cap = self.steppers[pid].processor.options.poll_interval
                            delays[pid] = min(delays[pid] * 2, cap)
                            due[pid] = time.monotonic() + delays[pid]
                    if not idle and idle_since < now:  # a whole pass found no work
                        idle = True
                        self.events("idle", {"since_seconds": round(time.monotonic() - idle_since, 3)})
                    if live is not None:
                        live.update(_table(self))
                    if idle_exit is not None and time.monotonic() - idle_since > idle_exit:
                        break
                    self.stop_event.wait(max(0.0, min(due.values(), default=now + 0.5) - time.monotonic()))
        return self.stats


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _table(runner: GraphRunner) -> Any:
    from rich.table import Table

    table = Table("processor", "kind", "strategy", "steps", "rows in", "rows out", "errors", "recovered")
    for pid, s in runner.stats.items():
        p = runner.graph.processors[pid]
        table.add_row(pid, p.kind.value, p.strategy.value, str(s.steps), f"{s.rows_in:,}",
                      f"{s.rows_out:,}", str(s.errors), str(s.recovered))
    return table


def _live(runner: GraphRunner) -> Any:
    from rich.live import Live

    return Live(_table(runner), refresh_per_second=4, transient=False)
