"""Replaying error rows: feed the input rows a processor failed on back to it, exactly once.

After the user fixed the function (or the data it depends on), ``cues errors replay --processor P``
(or the Dagster job ``replay_errors``) re-runs P on the input rows of chosen error rows. Contract
of :func:`replay_errors`, per lane of P that has chosen rows:

1. Select: the error rows of the lane in P's error queue matching ``where`` (a Spark SQL
   expression over the error queue's columns). Refused rows are counted, never replayed: a
   contract break (its step delivered its other rows: replaying its input would deliver them
   twice). A row whose input a retention rule removed, or whose queue partition the lane no
   longer reads (a redeploy), is *unavailable*: reported, not replayed, the call fails after.
2. Fence and recover the lane (``ExactlyOnceStepper.recover``: a running instance of the lane is
   fenced out, a step it left half-delivered is rolled forward).
3. Read the lane's *replay log* AFTER the fence: every attempt in its backing queue whose snapshot
   names an error row (``Snapshot.replay``). Backing records are never deleted, so a row is
   replayed at most once however often the same selection is replayed; a second replay of the
   same selection does nothing. (A concurrent replay of the same lane fences this one: its
   first append fails with :class:`ProcessorFencedError`, nothing of it delivered.)
4. For each chosen row not in the log, in error-queue order, one *replay step*: the next step of
   the lane, whose snapshot is the error row's input ranges plus ``replay = the row``, so its
   delivery hash is new and derived from the row. Steps 2-3 of the step protocol run as for any
   step (the function, isolation of rows that fail again, contracts). The step always takes
   the attempt path (``ExactlyOnceStepper.complete``): its attempt record, appended before any
   output commit, IS the log entry; the output queues, then the home, are committed with
   ``proc:{lane} = step`` and no ``pos:`` transaction: the lane's positions do not move.
5. The report: rows replayed and delivered, rows that failed again (new error rows of the
   replay step, which can themselves be replayed), rows already replayed, refused, unavailable.

Crash safety: a crash before a replay step's attempt record is a crash before ``after_prepare``
(nothing visible, the row is not in the log; the next replay does it). After the record, the
outcome is fixed: the next start of the lane (a replay, ``cues run`` or a Dagster run) rolls it
forward, never recomputes it; the row is in the log and is never replayed again.

Not replayable (:class:`ReplayRefusedError`): a sink and a ``snapshot_at=read`` processor (their
functions make effects keyed by the step's hash; the failed step may have made some of them
before it raised, and a replay under a new hash could repeat them), a source or imperative
processor (no input rows), and a processor that is not exactly_once (no backing queue to log
the replay in).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cues_platform.processing.backing import (
    BackingOf,
    BackingQueue,
    ErrorRef,
    Range,
    Snapshot,
    open_backing,
)
from cues_platform.processing.deployments import check
from cues_platform.processing.errors import ProcessingError
from cues_platform.processing.failures import CONTRACT_EXCEPTION_TYPE
from cues_platform.processing.graph import Graph
from cues_platform.processing.model import Kind, Processor, SnapshotAt, Strategy
from cues_platform.processing.step import ExactlyOnceStepper, StepResult
from cues_platform.queues import Lake
from cues_platform.queues.reader import execute_spark, plan_read
from cues_platform.queues.schema import OFFSET


class ReplayRefusedError(ProcessingError):
    """The processor's error rows cannot be replayed exactly once (see the module docstring);
    ``processor``, ``reason``. Retrying does not help."""


class ReplayIncompleteError(ProcessingError):
    """Some chosen error rows could not be read again (the report's ``unavailable``): the others
    were replayed. ``processor``, ``rows``. Retrying does not help: the inputs are gone."""


class ReplaySelectionError(ProcessingError):
    """``--where`` is not an expression over the error queue's columns; ``where``."""


@dataclass(frozen=True)
class Chosen:
    """One selected error row and the input ranges it names, by the lane's current bindings."""

    ref: ErrorRef
    lane: str
    inputs: Mapping[str, Range] | None  # None: unavailable (``why``)
    why: str = ""


@dataclass
class ReplayReport:
    processor: str
    error_queue: str
    selected: int = 0
    refused_contract: int = 0
    already_replayed: int = 0
    replayed: int = 0  # delivered by a replay step, no error row this time
    failed_again: int = 0  # the replay step wrote error rows again (replayable in turn)
    unavailable: list[str] = field(default_factory=list)
    steps: list[StepResult] = field(default_factory=list)
    dry_run: bool = False

    @property
    def pending(self) -> int:
        """Rows chosen and not replayed before (what a dry run would replay)."""
        return self.selected - self.refused_contract - self.already_replayed - len(self.unavailable)

    def summary(self) -> str:
        verb = "would replay" if self.dry_run else "replayed"
        done = self.pending if self.dry_run else self.replayed + self.failed_again
        parts = [f"{self.processor}: {self.selected} error row(s) of {self.error_queue!r} selected",
                 f"{verb} {done}"]
        if not self.dry_run:
            parts.append(f"{self.replayed} delivered, {self.failed_again} failed again (new error rows)")
        parts.append(f"{self.already_replayed} replayed before (skipped)")
        if self.refused_contract:
            parts.append(f"{self.refused_contract} contract break(s) not replayable (their steps "
                         "delivered their other rows; fix the contract or the rows by hand)")
        if self.unavailable:
            parts.append(f"{len(self.unavailable)} unavailable: " + "; ".join(self.unavailable[:5]))
        return ", ".join(parts)


def replayable(processor: Processor) -> None:
    """Raise :class:`ReplayRefusedError` unless ``processor``'s error rows can be replayed."""
    reason = None
    if processor.kind is Kind.SINK:
        reason = "it is a sink: its function makes effects keyed by the step's hash"
    elif processor.kind not in (Kind.MAP, Kind.JOIN, Kind.ALTS, Kind.FORK):
        reason = f"it is a {processor.kind.value} processor: it has no input rows to replay"
    elif processor.strategy is not Strategy.EXACTLY_ONCE:
        reason = (f"its strategy is {processor.strategy.value}: only an exactly_once processor "
                  "has a backing queue to log a replay in")
    elif processor.options.snapshot_at is SnapshotAt.READ:
        reason = "it snapshots at read (snapshot_at=read): its function makes effects keyed by the step's hash"
    if reason is not None:
        raise ReplayRefusedError(f"error rows of processor {processor.id!r} cannot be replayed exactly "
                                 f"once: {reason}; re-feed those rows by hand if they must be processed",
                                 processor=processor.id, reason=reason)


def replayed_refs(backing: BackingQueue) -> set[ErrorRef]:
    """Step 3: the replay log of a lane, the error rows its attempts replayed."""
    if backing.queue.next_offset("0") == 0:
        return set()
    table = backing.queue.read_arrow(partition="0", columns=["snapshot"])
    return {snap.replay for text in table.column("snapshot").to_pylist()
            if '"replay"' in text and (snap := Snapshot.from_json(text)).replay is not None}


def select(*, graph: Graph, family: str, lake: Lake, spark: Any, where: str | None,
           error_queue: str) -> tuple[list[Chosen], int]:
    """Step 1: ``(chosen rows in error-queue order, contract breaks refused)``."""
    lanes = {p.id: p for p in graph.processors.values() if (p.family or p.id) == family}
    queue = lake.queue(error_queue)
    chosen: list[Chosen] = []
    refused = 0
    for part in queue.partitions:
        plan = plan_read(queue, partition=part, start=None, end=None)  # start to end, one snapshot
        frame = execute_spark(queue, spark, plan)
        # the family's lanes, those the graph no longer has included (reported, not skipped)
        frame = frame.where(frame["processor"].isin(sorted(lanes))
                            | frame["processor"].startswith(f"{family}."))
        if where:
            frame = _where(frame, where)
        for row in frame.select(OFFSET, "processor", "inputs", "exception_type").orderBy(OFFSET).collect():
            if row["exception_type"] == CONTRACT_EXCEPTION_TYPE:
                refused += 1
                continue
            ref = ErrorRef(error_queue, part, int(row[OFFSET]))
            lane = lanes.get(row["processor"])
            chosen.append(Chosen(ref, row["processor"], None, f"{ref}: lane {row['processor']!r} is no "
                                 "longer in the graph (its partition is gone)") if lane is None
                          else _ranges(lake, lane, ref, row["inputs"]))
    return chosen, refused


def _where(frame: Any, where: str) -> Any:
    from pyspark.errors import AnalysisException, ParseException

    try:
        frame = frame.where(where)
        frame.schema  # noqa: B018 - resolve now: a bad column fails HERE, not mid-replay
        return frame
    except (AnalysisException, ParseException) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ReplaySelectionError(
            f"--where {where!r} is not a Spark SQL condition over the error queue's columns "
            f"(processor, step, inputs, exception_type, message, payload, failed_at, {OFFSET}): "
            f"{first}", where=where) from exc


def _ranges(lake: Lake, lane: Processor, ref: ErrorRef, inputs: str) -> Chosen:
    """The error row's ranges under the lane's current bindings (matched by queue and partition:
    a binding's name says nothing after a redeploy), or why they cannot be read again."""
    try:
        recorded = [Range(*v) for v in json.loads(inputs).values()]
    except (ValueError, TypeError) as exc:
        return Chosen(ref, lane.id, None, f"{ref}: its inputs are not readable ({exc})")
    by_pair = {(r.queue, r.partition): r for r in recorded}
    now = {(s.queue, s.partition): b for b, s in lane.inputs.items()}
    if set(by_pair) != set(now):
        return Chosen(ref, lane.id, None, f"{ref}: it read {sorted(by_pair)}, lane {lane.id!r} now "
                      f"reads {sorted(now)} (redeployed): replay it with the graph that failed on it")
    for (qname, part), r in by_pair.items():
        q = lake.queue(qname)
        first = q.start_offset(part) if part in q.partitions else 0
        if r.size and (r.start < first or r.end > q.next_offset(part)):
            return Chosen(ref, lane.id, None, f"{ref}: {qname}/{part} [{r.start}, {r.end}) is no "
                          f"longer in the queue (it starts at {first}: removed by retention)")
    return Chosen(ref, lane.id, {now[pair]: r for pair, r in by_pair.items()})


def replay_errors(*, graph: Graph, processor: str, lake: Lake, spark: Any, where: str | None = None,
                  resources: Mapping[str, Any] | None = None, backing_of: BackingOf | None = None,
                  dry_run: bool = False, progress: Callable[[int, int], None] | None = None,
                  hook: Callable[[str], None] | None = None) -> ReplayReport:
    """Steps 1-5 for the declared processor (family) ``processor``; see the module docstring.
    ``hook``: the step protocol's crash points (the crash tests')."""
    current = graph.with_lake_partitions({q: lake.queue(q).partitions for q in graph.queues
                                          if lake.has_queue(q)})
    declared = current.as_declared(processor)
    replayable(declared)
    error_queue = current.error_queue_of(declared)
    if not error_queue:
        raise ReplayRefusedError(f"processor {processor!r} has no error queue: it has no error rows "
                                 "to replay", processor=processor, reason="no error queue")
    report = ReplayReport(processor, error_queue, dry_run=dry_run)
    if not lake.has_queue(error_queue):
        return report
    # a graph `cues run` would refuse is refused here too, before any step (deployments.py)
    check(current, lake, only=[p.id for p in current.processors.values() if (p.family or p.id) == processor])
    backing_of = backing_of or open_backing(lake)
    # Step 1
    chosen, report.refused_contract = select(graph=current, family=processor, lake=lake, spark=spark,
                                             where=where, error_queue=error_queue)
    report.selected = len(chosen) + report.refused_contract
    report.unavailable = [c.why for c in chosen if c.inputs is None]
    by_lane: dict[str, list[Chosen]] = {}
    for c in chosen:
        if c.inputs is not None:
            by_lane.setdefault(c.lane, []).append(c)
    if dry_run:
        for lane, rows in by_lane.items():  # each lane's log read once, not once per row
            log = replayed_refs(backing_of(lane))
            report.already_replayed += sum(1 for c in rows if c.ref in log)
        return report
    todo = sum(len(rows) for rows in by_lane.values())
    done = 0
    for lane, rows in by_lane.items():
        stepper = ExactlyOnceStepper(graph=current, processor=current.processors[lane], lake=lake,
                                     spark=spark, resources=resources, backing_of=backing_of, hook=hook)
        # Step 2
        stepper.recover()
        # Step 3
        log = replayed_refs(stepper.backing)
        for c in rows:
            if c.ref in log:
                report.already_replayed += 1
                done += 1
                continue
            # Step 4
            result = _replay_step(stepper, c, error_queue)
            report.steps.append(result)
            if result.rows_out.get(error_queue, 0):
                report.failed_again += 1
            else:
                report.replayed += 1
            done += 1
            if progress is not None:
                progress(done, todo)
    return report


def _replay_step(stepper: ExactlyOnceStepper, chosen: Chosen, error_queue: str) -> StepResult:
    inputs = dict(chosen.inputs or {})
    alts = None
    if stepper.processor.kind is Kind.ALTS:
        alts = next((b for b, r in inputs.items() if r.size), None)
    snapshot = Snapshot(stepper.processor.id, stepper.next_step, inputs, alts, replay=chosen.ref)
    stepper.pending = snapshot
    return stepper.complete(snapshot, stepper.run_and_prepare(snapshot))


__all__ = ["Chosen", "ReplayIncompleteError", "ReplayRefusedError", "ReplayReport", "ReplaySelectionError", "replay_errors",
           "replayable", "replayed_refs", "select"]
