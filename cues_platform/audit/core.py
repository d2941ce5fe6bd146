"""The audit: steps 1-7 of the package docstring over one lake, in reading order."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from cues_platform.audit.attribution import attribution_checks
from cues_platform.audit.backing import (
    Backing,
    Known,
    outcome_of,
    parse_records,
    read_backing,
    record_rows,
)
from cues_platform.audit.coverage import coverage, input_ends
from cues_platform.audit.discovery import (
    backing_folders,
    backing_uri,
    check_lake,
    list_dirs,
    queue_folders,
)
from cues_platform.audit.errors import AuditError
from cues_platform.audit.failures import platform_error_checks
from cues_platform.audit.isolated import (
    Replays,
    error_row_checks,
    error_row_counts,
    read_error_queues,
    replay_checks,
)
from cues_platform.audit.once import count_checks, delivered_steps, transaction_checks
from cues_platform.audit.positions import position_checks, stored_positions
from cues_platform.audit.report import (
    MALFORMED_RECORD,
    MISSING_QUEUE,
    AuditReport,
    InputLag,
    ProcessorSummary,
    Violation,
    sort_violations,
)
from cues_platform.audit.retained import Retained, retained_outputs
from cues_platform.audit.rows import QueueRows, read_queue_rows
from cues_platform.audit.sequence import Steps, alts_violations, arrange
from cues_platform.audit.storage import (
    STORAGE_ERRORS,
    check_table,
    checkpoint_violations,
    system_table_checks,
    unreadable_violation,
)
from cues_platform.audit.trust import rows_without_input, staged_file_checks
from cues_platform.processing.backing import Record
from cues_platform.processing.graph import Graph, Strategy
from cues_platform.processing.history import BadCommit, commit_records, merge
from cues_platform.queues import Lake, Queue
from cues_platform.queues.layout import PROCESSOR_STEP
from cues_platform.queues.names import join_uri
from cues_platform.queues.retention import start_offsets


@dataclass
class _Findings:
    """What the audit found so far: violations and notes, in the order it found them."""

    violations: list[Violation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def unreadable(self, exc: BaseException, **where: str) -> None:
        self.violations.append(unreadable_violation(exc, **where))


@dataclass
class _Histories:
    """The backing records of every processor, arranged into steps (steps 4 and 2's inputs)."""

    steps: dict[str, Steps] = field(default_factory=dict)
    known: dict[str, Known] = field(default_factory=dict)  # hash -> attempt
    snapshot_only: dict[str, Record] = field(default_factory=dict)  # hash -> trailing snapshot
    eo_queues: set[str] = field(default_factory=set)  # queues written exactly once
    truncated: set[str] = field(default_factory=set)  # first backing records retained away


def audit(lake: Lake, *, graph: Graph | None = None) -> AuditReport:
    """Audit every exactly-once processor of ``lake`` (see the package docstring for the checks).

    ``graph`` (optional) adds cross-checks with the declared topology: exactly-once processors
    that never ran, backing queues of processors the graph does not declare, and error rows of
    at-least/at-most-once processors (which carry hashes without backing records).
    """
    if not isinstance(lake, Lake):
        raise AuditError(f"audit() needs a Lake, got {type(lake).__name__}")
    check_lake(lake)
    found = _Findings()
    # Step 5 first, so that the other steps read only what opens (and report nothing twice).
    backing_queues = _open_backing_queues(lake, found)
    _check_system_tables(lake, found)
    queues, unreadable = _open_queues(lake, found)
    starts = _start_offsets(queues, found)
    # Read the backing queues first (see the package docstring on ordering).
    backings = _read_backings(lake, backing_queues, found)
    seen_versions = _merge_step_commits(queues, backings, found)
    h = _arrange(backings, found)
    h.eo_queues |= _queues_with_step_commits(queues, backings, found)
    rows = _read_rows(h.eo_queues, queues, unreadable, backings, found)
    for name, qr in rows.items():
        starts.update({(name, p): s for p, s in qr.starts.items()})
    ends = input_ends(h.steps, queues)
    late = _late_attempts(backings, queues, seen_versions, found)
    found.violations += _missing_queues(rows, h.known)
    # Step 3: which steps' rows are below an output partition's start offset (retained, not
    # missing), and whether they fit below it; which attempts are delivered.
    retained = retained_outputs(h.steps, rows)
    found.violations += retained.violations
    delivered, pendings = _delivered(h.steps, rows, retained, found)
    # Step 2: attribution of every hashed (and unhashed) row.
    found.violations += attribution_checks(rows, h.known, late, h.snapshot_only, graph, backings,
                                           found.notes)
    # Step 3: counts, contiguity and app transactions.
    found.violations += count_checks(rows, h.known, retained)
    found.violations += transaction_checks(rows, h.known, late)
    _trust_checks(lake, h.steps, delivered, rows, found)
    summaries = _coverage(h.steps, delivered, pendings, backings, ends, found)
    _position_checks(lake, delivered, queues, backings, starts, h.truncated, found)
    _platform_error_checks(queues, found)
    replays = _error_rows_and_replays(queues, unreadable, h, summaries, found)
    if graph is not None:
        found.notes += graph_notes(graph, backings)
    return _report(lake, found, summaries=summaries, eo_queues=h.eo_queues, rows=rows,
                   all_queues=set(queues) | unreadable, starts=starts, backings=backings,
                   delivered=delivered, retained=retained, replays=replays)


def _open_backing_queues(lake: Lake, found: _Findings) -> dict[str, Queue]:
    """Step 5: every backing queue opens, its log is whole and agrees with its files."""
    backing_queues: dict[str, Queue] = {}
    for pid in backing_folders(lake):
        q, bad, more = check_table(
            lake, name=pid, uri=backing_uri(lake, pid), table=f"backing/{pid}", processor=pid
        )
        found.violations += bad
        found.notes += more
        if q is not None and not bad:
            backing_queues[pid] = q
        elif bad:
            found.notes.append(
                f"the backing queue of {pid!r} is unreadable: its steps are not audited, and rows "
                "with its hashes show as unknown_hash"
            )
    return backing_queues


def _check_system_tables(lake: Lake, found: _Findings) -> None:
    """Step 5: the system tables (tailer positions, transaction decisions, the deployments
    registry) and the home queues' digest queues (step records whose log entries are gone)."""
    found.violations += system_table_checks(lake)
    for home in list_dirs(lake.system_uri("digests"), lake):
        uri = lake.system_uri("digests", home)
        found.violations += checkpoint_violations(f"digests/{home}", uri, lake.options)
        _, bad, more = check_table(lake, name=home, uri=uri, table=f"digests/{home}")
        found.violations += bad
        found.notes += more


def _open_queues(lake: Lake, found: _Findings) -> tuple[dict[str, Queue], set[str]]:
    """Step 5: every queue that opens, and the names of those that do not."""
    queues: dict[str, Queue] = {}
    unreadable: set[str] = set()
    for name in queue_folders(lake):
        uri = join_uri(lake.root, "queues", name)
        found.violations += checkpoint_violations(name, uri, lake.options)
        q, bad, more = check_table(lake, name=name, uri=uri)
        found.violations += bad
        found.notes += more
        if bad:
            unreadable.add(name)
        elif q is not None:
            queues[name] = q
    return queues, unreadable


def _start_offsets(queues: Mapping[str, Queue], found: _Findings) -> dict[tuple[str, str], int]:
    """Start offsets (retention): rows below them were removed on purpose. Step 5 checked that
    every partition holds [start, next); the rows of exactly-once-written queues are read with
    their own snapshot's starts later (:func:`_read_rows`)."""
    starts: dict[tuple[str, str], int] = {}
    for name, q in sorted(queues.items()):
        try:
            starts.update({(name, p): s for p, s in start_offsets(q, snapshot=q.refresh()).items()})
        except STORAGE_ERRORS as exc:
            found.unreadable(exc, table=name, uri=q.uri)
    return starts


def _read_backings(lake: Lake, backing_queues: Mapping[str, Queue],
                   found: _Findings) -> dict[str, Backing]:
    backings: dict[str, Backing] = {}
    for pid, q in backing_queues.items():
        try:
            backings[pid] = read_backing(lake, pid, q)
        except STORAGE_ERRORS as exc:
            found.unreadable(exc, table=f"backing/{pid}", uri=q.uri, processor=pid)
    return backings


def _merge_step_commits(queues: Mapping[str, Queue], backings: Mapping[str, Backing],
                        found: _Findings) -> dict[str, int]:
    """The one-commit steps: their records are commit metadata in the queues' logs, merged into
    their processor's backing records. Returns the version of each queue read (a newer commit is
    read as late)."""
    seen_versions: dict[str, int] = {}
    for name, q in sorted(queues.items()):
        try:
            seen_versions[name] = q.refresh().version()  # before: a newer commit is read as late
            commits, bad_commits = commit_records(q)
        except STORAGE_ERRORS as exc:
            found.unreadable(exc, table=name, uri=q.uri)
            continue
        found.violations += [malformed_commit(b) for b in bad_commits]
        for pid, recs in commits.items():
            if pid in backings:
                b = backings[pid]
                b.records = merge(b.records, recs)
            else:
                found.notes.append(f"{len(recs)} step commit(s) of processor {pid!r} in {name}, "
                                   "which has no backing queue: not audited")
    return seen_versions


def _arrange(backings: Mapping[str, Backing], found: _Findings) -> _Histories:
    """Step 4: each backing queue itself, its records arranged into steps."""
    h = _Histories()
    for pid, b in backings.items():
        found.violations += b.violations
        first_step = 0
        if b.start > 0 and b.records:
            first_step = min(r.step for r in b.records)
            h.truncated.add(pid)
            found.notes.append(
                f"the backing queue of {pid!r} starts at offset {b.start} (its records below it "
                f"were retained away): its history is audited from step {first_step}, and the "
                "first reads of that step are not checked against R2 (where they start)")
        arranged = arrange(pid, b.records, first_step=first_step)
        found.violations += arranged.violations
        h.steps[pid] = arranged
        for rec in arranged.attempts.values():
            h.known.setdefault(rec.hash, Known(pid, rec))
            h.eo_queues.update(record_rows(rec))
            found.violations += alts_violations(pid, rec.snapshot)

        if arranged.pending_snapshot is not None:
            h.snapshot_only[arranged.pending_snapshot.hash] = arranged.pending_snapshot
            found.violations += alts_violations(pid, arranged.pending_snapshot.snapshot)
    return h


def _queues_with_step_commits(queues: Mapping[str, Queue], backings: Mapping[str, Backing],
                              found: _Findings) -> set[str]:
    """A queue that carries an exactly-once processor's ``proc:{p}`` app transaction is its output
    even when no record names it (records lost: a trimmed log, a damaged backing queue): its
    rows are checked, so such a lake fails the audit instead of passing unchecked."""
    out: set[str] = set()
    for name, q in sorted(queues.items()):
        try:
            dt = q.refresh()
            if any(dt.transaction_version(PROCESSOR_STEP.id(pid)) is not None for pid in backings):
                out.add(name)
        except STORAGE_ERRORS as exc:
            found.unreadable(exc, table=name, uri=q.uri)
    return out


def _read_rows(eo_queues: set[str], queues: Mapping[str, Queue], unreadable: set[str],
               backings: Mapping[str, Backing], found: _Findings) -> dict[str, QueueRows]:
    """The rows of every exactly-once-written queue, and their input end offsets."""
    rows: dict[str, QueueRows] = {}
    for name in sorted(eo_queues):
        if name in unreadable:
            rows[name] = QueueRows(name, True, {}, {}, readable=False)
            continue
        try:
            rows[name] = read_queue_rows(name, queues.get(name), backings)
        except STORAGE_ERRORS as exc:
            found.unreadable(exc, table=name, uri=queues[name].uri)
            rows[name] = QueueRows(name, True, {}, {}, readable=False)
    return rows


def _late_attempts(backings: Mapping[str, Backing], queues: Mapping[str, Queue],
                   seen_versions: Mapping[str, int], found: _Findings) -> dict[str, Known]:
    """Attempts appended meanwhile: their hashes are known, their steps are the next audit's."""
    late: dict[str, Known] = {}
    for pid, b in backings.items():
        try:
            table = b.queue.read_arrow(partition="0", start=b.cut)
        except STORAGE_ERRORS as exc:
            found.unreadable(exc, table=f"backing/{pid}", uri=b.queue.uri, processor=pid)
            continue
        for rec in parse_records(pid, table)[0]:
            if rec.is_attempt:
                late.setdefault(rec.hash, Known(pid, rec))
    for name, since in seen_versions.items():
        try:
            commits, _ = commit_records(queues[name], since=since)
        except STORAGE_ERRORS as exc:
            found.unreadable(exc, table=name, uri=queues[name].uri)
            continue
        for pid, recs in commits.items():
            for rec in recs:
                late.setdefault(rec.hash, Known(pid, rec))
    return late


def _missing_queues(rows: Mapping[str, QueueRows], known: Mapping[str, Known]) -> list[Violation]:
    """Step 3: every queue that an attempt names exists."""
    out = []
    for name, qr in rows.items():
        if not qr.exists:
            writers = sorted({k.processor for k in known.values() if name in record_rows(k.record)})
            out.append(Violation(
                MISSING_QUEUE,
                f"queue {name!r} is named by attempts of {', '.join(writers)} but does not exist",
                queue=name,
            ))  # fmt: skip
    return out


def _delivered(steps: Mapping[str, Steps], rows: Mapping[str, QueueRows], retained: Retained,
               found: _Findings) -> tuple[dict[str, list[Record]], dict[str, str | None]]:
    """Step 3: which attempts are delivered (the others are undelivered or pending)."""
    delivered: dict[str, list[Record]] = {}
    pendings: dict[str, str | None] = {}
    for pid, arranged in steps.items():
        delivered[pid], pendings[pid], bad = delivered_steps(pid, arranged, rows, retained)
        found.violations += bad
    return delivered, pendings


def _trust_checks(lake: Lake, steps: Mapping[str, Steps], delivered: Mapping[str, list[Record]],
                  rows: Mapping[str, QueueRows], found: _Findings) -> None:
    """Step 3: no step that read nothing produced rows. Step 4: every staged file an attempt names
    is in its step's staging folder (of this lake, while recovery may still read it)."""
    for pid, arranged in steps.items():
        found.violations += rows_without_input(pid, arranged.attempts.values(), rows)
        found.violations += staged_file_checks(lake, pid, arranged.attempts.values(), delivered[pid])


def _coverage(steps: Mapping[str, Steps], delivered: Mapping[str, list[Record]],
              pendings: Mapping[str, str | None], backings: Mapping[str, Backing],
              ends: Mapping[tuple[str, str], int | None],
              found: _Findings) -> dict[str, ProcessorSummary]:
    """Step 1: input coverage of delivered steps; each processor's summary."""
    summaries: dict[str, ProcessorSummary] = {}
    for pid, arranged in steps.items():
        cover_violations, lags = coverage(pid, delivered[pid], ends)
        found.violations += cover_violations
        summaries[pid] = _summary(backings[pid], arranged, delivered[pid], pendings[pid], lags)
    return summaries


def _position_checks(lake: Lake, delivered: Mapping[str, list[Record]],
                     queues: Mapping[str, Queue], backings: Mapping[str, Backing],
                     starts: Mapping[tuple[str, str], int], truncated: set[str],
                     found: _Findings) -> None:
    """Step 1: positions across lanes and redeployments."""
    try:
        stored = stored_positions(delivered, queues, backings)
    except STORAGE_ERRORS as exc:  # a queue that opened but whose log cannot be read now
        found.unreadable(exc, table="positions", uri=lake.root)
        stored = {}
    found.violations += position_checks(delivered, stored, starts, frozenset(truncated))


def _platform_error_checks(queues: Mapping[str, Queue], found: _Findings) -> None:
    """Step 6: error rows written by platform failures, in every error queue."""
    for name, q in sorted(queues.items()):
        try:
            found.violations += platform_error_checks({name: q})
        except STORAGE_ERRORS as exc:
            found.unreadable(exc, table=name, uri=q.uri)


def _error_rows_and_replays(queues: Mapping[str, Queue], unreadable: set[str], h: _Histories,
                            summaries: dict[str, ProcessorSummary], found: _Findings) -> Replays:
    """Step 7: every attributed error row names its step and inputs right, once; every replay
    step replays one existing error row of its lane, once. Counts each processor's error rows
    (replayed / pending) into its summary."""
    errors = read_error_queues(queues, unreadable)
    for name, uri, exc in errors.failures:  # a queue that opened but whose rows cannot be read now
        found.unreadable(exc, table=name, uri=uri)
    found.violations += error_row_checks(h.known, errors)
    replays = replay_checks(h.steps, errors)
    found.violations += replays.violations
    for pid, (n, replayed) in error_row_counts(h.known, errors, replays).items():
        if pid in summaries:
            summaries[pid] = replace(summaries[pid], error_rows=n, error_rows_replayed=replayed)
    if replays.retained:
        found.notes.append(
            f"{replays.retained} replay step(s) re-fed error rows that retention has since removed "
            "from their error queue: they exist (below the start offset) but their inputs and "
            "processor could not be compared")
    return replays


def _report(lake: Lake, found: _Findings, *, summaries: Mapping[str, ProcessorSummary],
            eo_queues: set[str], rows: Mapping[str, QueueRows], all_queues: set[str],
            starts: Mapping[tuple[str, str], int], backings: Mapping[str, Backing],
            delivered: Mapping[str, list[Record]], retained: Retained,
            replays: Replays | None = None) -> AuditReport:
    retained_below: dict[str, dict[str, int]] = {}
    for (name, part), start in sorted(starts.items()):
        if start > 0:
            retained_below.setdefault(name, {})[part] = start
    for pid, b in sorted(backings.items()):
        if b.start > 0:
            retained_below[f"backing/{pid}"] = {"0": b.start}
    below_start = sum(
        1 for recs in delivered.values() for rec in recs for r in rec.snapshot.inputs.values()
        if r.size > 0 and r.start < starts.get((r.queue, r.partition), 0))
    return AuditReport(
        lake=lake.root,
        violations=tuple(sort_violations(found.violations)),
        processors=dict(sorted(summaries.items())),
        queues_checked=tuple(sorted(q for q in eo_queues if rows[q].exists and rows[q].readable)),
        queues_not_checked=tuple(sorted(all_queues - eo_queues)),
        notes=tuple(found.notes),
        retained_below=retained_below,
        retained_steps={
            "input_ranges_below_start": below_start,
            "output_steps_committed": len(retained.proven),
            "output_steps_by_order": len(retained.by_order),
            "replays_of_retained_rows": replays.retained if replays is not None else 0,
        },
    )


def _summary(
    b: Backing, arranged: Steps, got: list[Record], pending: str | None, lags: list[InputLag]
) -> ProcessorSummary:
    rows_out: Counter[str] = Counter()
    for r in got:
        for q, parts in (r.outputs.get("rows") or {}).items():
            rows_out[q] += sum(int(n) for n in parts.values())
    pending_step = None
    if arranged.pending_snapshot is not None:
        pending_step = arranged.pending_snapshot.step
    elif pending is not None:
        pending_step = max(arranged.attempts)
    return ProcessorSummary(
        processor=b.processor,
        records=len(b.records),
        epoch=b.epoch,
        steps_delivered=len(got),
        outcomes=dict(Counter(outcome_of(r) for r in got)),
        rows_out=dict(rows_out),
        last_delivered_step=max((r.step for r in got), default=None),
        pending=pending,
        pending_step=pending_step,
        inputs=tuple(lags),
    )


def graph_notes(graph: Graph, backings: Mapping[str, Backing]) -> list[str]:
    """Cross-checks with a declared graph (notes, not violations)."""
    notes = []
    for pid, proc in sorted(graph.processors.items()):
        eo = proc.strategy is Strategy.EXACTLY_ONCE and proc.inputs
        if eo and pid not in backings:
            notes.append(
                f"graph {graph.name!r}: exactly-once processor {pid!r} has no backing queue yet (never ran)"
            )
        if not eo and pid in backings:
            notes.append(
                f"graph {graph.name!r}: processor {pid!r} is {proc.strategy.value}/{proc.kind.value} but has a backing queue"
            )
    for pid in sorted(set(backings) - set(graph.processors)):
        notes.append(
            f"backing queue of processor {pid!r}, which graph {graph.name!r} does not declare"
        )
    return notes


def malformed_commit(bad: BadCommit) -> Violation:
    return Violation(
        MALFORMED_RECORD,
        f"commit {bad.version} of {bad.queue} claims to be the step record of processor "
        f"{bad.processor!r} but {bad.problem}",
        processor=bad.processor, queue=bad.queue,
    )
