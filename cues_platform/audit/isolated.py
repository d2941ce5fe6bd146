"""Step 7 of the audit: error rows and replays. Every input row of a step is either delivered once
or in the error queue once, never both, never neither; a replayed error row is fed back once.

What a step writes to its error queue (``processing/isolation.py``, ``processing/outputs.py``)
is committed with the step, under its delivery hash. For every error row whose hash is an attempt
of an exactly-once processor (rows with other hashes are step 2's), this module proves from the
lake:

E1. The row's ``processor`` and ``step`` columns are the attempt's ([error_row_step]): the row
    says which step failed on it, and a replay feeds it to that lane.
E2. Its ``inputs`` (JSON ``{binding: [queue, partition, start, end]}``) is readable and is either
    exactly the step's snapshot ranges (a whole-step error: ``OnError.WHOLE_STEP``, a sink, a
    step that could not be isolated; every contract break ``cues_platform.ContractViolation``,
    which is an output row's fault and always holds the step's ranges) or the snapshot's ranges
    with exactly one binding narrowed to one offset ``[o, o + 1)`` inside that binding's range
    (an isolated row), and the narrowed rows of one step narrow the same binding (isolation
    splits one input per step) ([error_row_inputs]). An audit fails on what it cannot read: an
    ``inputs`` that does not parse is a violation, never skipped.
E3. No input row is in the error queue twice for one step ([error_row_twice]): at most one
    whole-step row per step (contract breaks aside), no isolated row beside it (its offset is in
    the whole row already), no two isolated rows with the same offset. Since every isolated
    row's offset is inside the step's range and distinct, an isolated step's error rows number
    at most its range's size (that bound needs no check of its own).

Across steps this module relies on what the other checks prove: the ranges of a lane's
non-replay steps are disjoint and in order, and lanes of a family do not read each other's
partitions (:mod:`.positions`, R1-R3), so rows of two different steps never name the same
offset unless one step is a replay; the rows of a step are in the queue once, under its hash
(:mod:`.once`: [delivered_twice], [row_count_mismatch]); and the step's other rows (its output)
are delivered once with it. A replay step (``Snapshot.replay``, ``processing/replay.py``) re-reads
the ranges of one error row on purpose; its snapshot is exempt from positions' continuity rules
(R1-R4) and is proven here instead:

P1. The error row it names exists in that error queue ([replay_missing]): the queue exists, is
    an error queue, and holds the offset. A row below the partition's start offset was removed
    by retention (its ``start:`` transaction, proven by step 5 to agree with the files): the
    replay's content cannot be checked any more and is counted in the report
    (``retained_steps["replays_of_retained_rows"]``), not a violation. A row the audit cannot
    read for any other reason (the error queue is unreadable) is [replay_unverifiable].
P2. That row's ``processor`` is the replay step's lane, its ``inputs`` are the replay step's
    ranges (as a set of ``[queue, partition, start, end]``: binding names may change with a
    redeploy), and it is not a contract break (the step that wrote one delivered its other
    rows: replaying its input would deliver them twice) ([replay_mismatch]).
P3. No error row is replayed by two attempts ([replayed_twice]). Every attempt counts, delivered
    or not: an attempt record is the replay log's entry, and recovery delivers a pending one.

With P1-P3, a replay step's input is exactly one error row's, that row is replayed once, and
the replay step's own outcome (delivered rows, or new error rows inside its ranges, E1-E3) takes
that row's place: so the error rows not replayed (*pending*) name disjoint inputs, and each input
row is delivered once or in exactly one pending error row. The report counts, per processor, its
error rows and how many are replayed.

What this module does NOT prove: that an isolated row's output is absent from the rows the step
delivered. The error row names the input offset; the delivered rows of a general map do not
carry their source offset, so the lake cannot tell which output row came from which input row.
The Jepsen checker (``cues_platform/jepsen/checker.py``) proves it where rows carry keys. Nor
does it prove that the function really fails on an isolated row (only that the step named it
once): re-running the function is not the audit's business.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from cues_platform.audit.backing import Known
from cues_platform.audit.failures import is_error_queue
from cues_platform.audit.report import (
    ERROR_ROW_INPUTS,
    ERROR_ROW_STEP,
    ERROR_ROW_TWICE,
    REPLAY_MISMATCH,
    REPLAY_MISSING,
    REPLAY_UNVERIFIABLE,
    REPLAYED_TWICE,
    Violation,
)
from cues_platform.audit.sequence import Steps
from cues_platform.audit.storage import STORAGE_ERRORS
from cues_platform.processing.backing import ErrorRef, Record, Snapshot
from cues_platform.processing.failures import CONTRACT_EXCEPTION_TYPE
from cues_platform.queues import Queue
from cues_platform.queues.based import read_delta
from cues_platform.queues.retention import start_offsets
from cues_platform.queues.schema import DELIVERY_HASH, OFFSET, PARTITION

Ranges = dict[str, tuple[str, str, int, int]]  # binding -> (queue, partition, start, end)
COLUMNS = ("processor", "step", "inputs", "exception_type")


@dataclass(frozen=True)
class ErrorRow:
    """One row of an error queue, projected to what the checks read."""

    queue: str
    partition: str
    offset: int
    hash: str | None
    processor: str | None
    step: int | None
    inputs: str | None
    exception_type: str | None

    @property
    def ref(self) -> ErrorRef:
        return ErrorRef(self.queue, self.partition, self.offset)

    @property
    def contract(self) -> bool:
        return self.exception_type == CONTRACT_EXCEPTION_TYPE


@dataclass
class ErrorQueues:
    """The rows of every error queue, and what bounds them."""

    rows: dict[ErrorRef, ErrorRow] = field(default_factory=dict)
    by_hash: dict[str, list[ErrorRow]] = field(default_factory=dict)
    starts: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, partition) -> start
    error_queues: set[str] = field(default_factory=set)
    other_queues: set[str] = field(default_factory=set)  # queues that are not error queues
    unreadable: set[str] = field(default_factory=set)  # could not be read: nothing proven
    failures: list[tuple[str, str, BaseException]] = field(default_factory=list)  # name, uri, why


def read_error_queues(queues: Mapping[str, Queue], unreadable: set[str]) -> ErrorQueues:
    """Every error queue's rows, columns projected. ``unreadable``: queues step 5 could not open;
    a queue that fails to read here joins them, with the exception in ``failures``."""
    out = ErrorQueues(unreadable=set(unreadable))
    for name, queue in sorted(queues.items()):
        if not is_error_queue(queue):
            out.other_queues.add(name)
            continue
        try:
            dt = queue.refresh()
            starts = start_offsets(queue, snapshot=dt)
            table = read_delta(dt, columns=[*COLUMNS, PARTITION, OFFSET, DELIVERY_HASH])
        except STORAGE_ERRORS as exc:
            out.unreadable.add(name)
            out.failures.append((name, queue.uri, exc))
            continue
        out.error_queues.add(name)
        out.starts.update({(name, p): s for p, s in starts.items()})
        table = table.sort_by([(PARTITION, "ascending"), (OFFSET, "ascending")])
        cols = {c: table[c].to_pylist() for c in (*COLUMNS, PARTITION, OFFSET, DELIVERY_HASH)}
        for i in range(table.num_rows):
            row = ErrorRow(name, cols[PARTITION][i], int(cols[OFFSET][i]), cols[DELIVERY_HASH][i],
                           cols["processor"][i], cols["step"][i], cols["inputs"][i],
                           cols["exception_type"][i])
            out.rows[row.ref] = row
            if row.hash is not None:
                out.by_hash.setdefault(row.hash, []).append(row)
    return out


def snapshot_ranges(snapshot: Snapshot) -> Ranges:
    return {b: (r.queue, r.partition, r.start, r.end) for b, r in snapshot.inputs.items()}


def parse_inputs(text: str | None) -> Ranges | str:
    """An error row's ``inputs``, or what is wrong with it (in words)."""
    try:
        body = json.loads(text) if text is not None else None
    except ValueError as exc:
        return f"it is not JSON ({exc})"
    if not isinstance(body, dict) or not body:
        return "it is not a JSON object of bindings"
    out: Ranges = {}
    for binding, value in body.items():
        ok = (isinstance(value, list) and len(value) == 4 and all(isinstance(v, str) for v in value[:2])
              and all(isinstance(v, int) and not isinstance(v, bool) for v in value[2:])
              and 0 <= value[2] <= value[3])
        if not ok:
            return f"binding {binding!r} is {value!r}, not [queue, partition, start, end]"
        out[binding] = (value[0], value[1], value[2], value[3])
    return out


def _words(ranges: Mapping[str, tuple[str, str, int, int]]) -> str:
    return ", ".join(f"{b}={q}/{p} [{s}, {e})" for b, (q, p, s, e) in sorted(ranges.items()))


def _at(row: ErrorRow) -> str:
    return f"the error row at {row.queue}/{row.partition} offset {row.offset}"


def error_row_checks(known: Mapping[str, Known], errors: ErrorQueues) -> list[Violation]:
    """E1-E3 for every error row whose hash is a known attempt's."""
    bad: list[Violation] = []
    for h, rows in sorted(errors.by_hash.items()):
        k = known.get(h)
        if k is not None:
            bad += _step_rows(k, rows)
    return bad


def _step_rows(k: Known, rows: list[ErrorRow]) -> list[Violation]:
    pid, rec = k.processor, k.record
    want = snapshot_ranges(rec.snapshot)
    step_text = f"step {rec.step} of {pid!r} (it read {_words(want) or 'nothing'})"

    def violation(kind: str, row: ErrorRow, message: str) -> Violation:
        return Violation(kind, message, processor=pid, queue=row.queue, partition=row.partition,
                         offsets=(row.offset, row.offset + 1), hash=rec.hash, step=rec.step)

    bad: list[Violation] = []
    whole: list[ErrorRow] = []
    narrowed: dict[tuple[str, int], list[ErrorRow]] = defaultdict(list)
    for row in rows:
        if row.processor != pid or row.step != rec.step:  # E1
            bad.append(violation(ERROR_ROW_STEP, row, (
                f"{_at(row)} carries the delivery hash of {step_text} but names processor "
                f"{row.processor!r} step {row.step}: a replay would feed it to the wrong step")))
        got = parse_inputs(row.inputs)  # E2
        if isinstance(got, str):
            bad.append(violation(ERROR_ROW_INPUTS, row, (
                f"{_at(row)} of {step_text} has an unreadable inputs column ({got}): which input "
                f"rows it holds cannot be proven; inputs = {str(row.inputs)[:200]!r}")))
            continue
        if got == want:
            if not row.contract:
                whole.append(row)
            continue
        diff = sorted(b for b in set(got) | set(want) if got.get(b) != want.get(b))
        why = None
        if row.contract:
            why = "a contract break holds the step's whole ranges"
        elif set(got) != set(want):
            why = "its bindings are not the step's"
        elif len(diff) != 1:
            why = f"it differs from the step's ranges in {len(diff)} bindings ({', '.join(diff)})"
        else:
            (b,) = diff
            q, p, s, e = got[b]
            wq, wp, ws, we = want[b]
            if (q, p) != (wq, wp) or e != s + 1 or not ws <= s < we:
                why = (f"binding {b!r} names {q}/{p} [{s}, {e}), not one offset inside the step's "
                       f"{wq}/{wp} [{ws}, {we})")
            else:
                narrowed[(b, s)].append(row)
        if why is not None:
            bad.append(violation(ERROR_ROW_INPUTS, row, (
                f"{_at(row)} of {step_text} names inputs {_words(got)}, which are neither the "
                f"step's ranges nor the step's ranges with one binding narrowed to one offset "
                f"inside it: {why}")))
    # E3: each input row in the step's error rows once
    for row in whole[1:]:
        bad.append(violation(ERROR_ROW_TWICE, row, (
            f"{_at(row)} is a second whole-step error row of {step_text} (the first is at offset "
            f"{whole[0].offset}): its input rows are in the error queue twice")))
    for (b, o), same in sorted(narrowed.items()):
        first = f"the whole-step error row at offset {whole[0].offset}" if whole else None
        for i, row in enumerate(same):
            other = first or (f"the error row at offset {same[0].offset}" if i else None)
            if other is None:
                continue
            bad.append(violation(ERROR_ROW_TWICE, row, (
                f"{_at(row)} holds input {want[b][0]}/{want[b][1]} offset {o} (binding {b!r}) of "
                f"{step_text}, which {other} of the same step holds too: the input row is in the "
                "error queue twice")))
    bindings = sorted({b for b, _ in narrowed})
    if len(bindings) > 1:
        first = min((r for rs in narrowed.values() for r in rs), key=lambda r: r.offset)
        bad.append(violation(ERROR_ROW_INPUTS, first, (
            f"the isolated error rows of {step_text} narrow bindings {', '.join(bindings)}; "
            "isolation splits one input per step, so the others must be whole")))
    return bad


@dataclass
class Replays:
    """What :func:`replay_checks` found."""

    violations: list[Violation] = field(default_factory=list)
    replayed: dict[ErrorRef, list[tuple[str, Record]]] = field(default_factory=dict)
    retained: int = 0  # replays of rows retention removed: checked structurally only


def replay_checks(steps: Mapping[str, Steps], errors: ErrorQueues) -> Replays:
    """P1-P3 over every attempt with ``Snapshot.replay`` set."""
    out = Replays()
    for pid, arranged in sorted(steps.items()):
        for step in sorted(arranged.attempts):
            rec = arranged.attempts[step]
            if rec.snapshot.replay is not None:
                out.replayed.setdefault(rec.snapshot.replay, []).append((pid, rec))
    for ref, users in sorted(out.replayed.items(), key=lambda x: (x[0].queue, x[0].partition, x[0].offset)):
        first_pid, first = users[0]
        for pid, rec in users[1:]:  # P3
            out.violations.append(Violation(
                REPLAYED_TWICE,
                f"error row {ref} is replayed by step {rec.step} of {pid!r} and already by step "
                f"{first.step} of {first_pid!r}: its input rows are delivered (or fail) twice",
                processor=pid, queue=ref.queue, partition=ref.partition,
                offsets=(ref.offset, ref.offset + 1), hash=rec.hash, step=rec.step,
            ))  # fmt: skip
        for pid, rec in users:
            problem = _replay_problem(pid, rec, ref, errors)
            if problem == "retained":
                out.retained += 1
            elif problem is not None:
                kind, why = problem
                out.violations.append(Violation(
                    kind, f"replay step {rec.step} of {pid!r} replays error row {ref}, but {why}",
                    processor=pid, queue=ref.queue, partition=ref.partition,
                    offsets=(ref.offset, ref.offset + 1), hash=rec.hash, step=rec.step,
                ))  # fmt: skip
    return out


def _replay_problem(pid: str, rec: Record, ref: ErrorRef,
                    errors: ErrorQueues) -> tuple[str, str] | str | None:
    """P1 and P2 for one replay step: ``(kind, why)``, ``"retained"``, or None."""
    row = errors.rows.get(ref)
    if row is None:
        if ref.queue in errors.unreadable:
            return REPLAY_UNVERIFIABLE, (f"error queue {ref.queue!r} cannot be read (see its "
                                         "[unreadable]/[corrupt_log] violation): the replay cannot be proven")
        if ref.queue in errors.other_queues:
            return REPLAY_MISMATCH, f"{ref.queue!r} is not an error queue"
        start = errors.starts.get((ref.queue, ref.partition))
        if start is not None and ref.offset < start:
            return "retained"  # P1: removed by retention (step 5 proves the start)
        where = ("does not exist" if ref.queue not in errors.error_queues
                 else "has no such partition" if start is None
                 else "does not hold that offset")
        return REPLAY_MISSING, (f"error queue {ref.queue!r} {where}: the replay step re-read input "
                                "ranges that no error row names")
    problems = []
    if row.processor != pid:
        problems.append(f"the row is processor {row.processor!r}'s, not this lane's")
    if row.contract:
        problems.append("the row is a contract break (its step delivered its other rows: "
                        "replaying its input delivers them twice)")
    got = parse_inputs(row.inputs)
    want = snapshot_ranges(rec.snapshot)
    if isinstance(got, str):
        problems.append(f"the row's inputs cannot be read ({got})")
    elif Counter(got.values()) != Counter(want.values()):
        problems.append(f"the row names inputs {_words(got)}, the replay step read {_words(want)}")
    if not problems:
        return None
    return REPLAY_MISMATCH, "; ".join(problems)


def error_row_counts(known: Mapping[str, Known], errors: ErrorQueues,
                     replays: Replays) -> dict[str, tuple[int, int]]:
    """processor -> (its error rows, how many of them are replayed)."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for h, rows in errors.by_hash.items():
        k = known.get(h)
        if k is None:
            continue
        for row in rows:
            counts[k.processor][0] += 1
            counts[k.processor][1] += row.ref in replays.replayed
    return {p: (n, r) for p, (n, r) in sorted(counts.items())}


__all__ = ["ErrorQueues", "ErrorRow", "Replays", "error_row_checks", "error_row_counts",
           "parse_inputs", "read_error_queues", "replay_checks", "snapshot_ranges"]
