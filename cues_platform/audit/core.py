"""The audit: steps 1-6 of the package docstring over one lake, in reading order."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

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
from cues_platform.audit.retained import retained_outputs
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
from cues_platform.processing.outputs import proc_app_id
from cues_platform.queues import Lake, Queue
from cues_platform.queues.names import join_uri
from cues_platform.queues.retention import start_offsets


def audit(lake: Lake, *, graph: Graph | None = None) -> AuditReport:
    """Audit every exactly-once processor of ``lake`` (see the package docstring for the checks).

    ``graph`` (optional) adds cross-checks with the declared topology: exactly-once processors
    that never ran, backing queues of processors the graph does not declare, and error rows of
    at-least/at-most-once processors (which carry hashes without backing records).
    """
    if not isinstance(lake, Lake):
        raise AuditError(f"audit() needs a Lake, got {type(lake).__name__}")
    check_lake(lake)
    violations: list[Violation] = []
    notes: list[str] = []

    # Step 5: every backing queue and queue opens, its log is whole and agrees with its files.
    # First, so that the other steps read only what opens (and report nothing twice).
    backing_queues: dict[str, Queue] = {}
    for pid in backing_folders(lake):
        q, bad, more = check_table(
            lake, name=pid, uri=backing_uri(lake, pid), table=f"backing/{pid}", processor=pid
        )
        violations += bad
        notes += more
        if q is not None and not bad:
            backing_queues[pid] = q
        elif bad:
            notes.append(
                f"the backing queue of {pid!r} is unreadable: its steps are not audited, and rows "
                "with its hashes show as unknown_hash"
            )
    # The system tables (tailer positions, transaction decisions, the deployments registry) and
    # the home queues' digest queues (step records whose log entries are gone).
    violations += system_table_checks(lake)
    for home in list_dirs(lake.system_uri("digests"), lake):
        uri = lake.system_uri("digests", home)
        violations += checkpoint_violations(f"digests/{home}", uri, lake.options)
        _, bad, more = check_table(lake, name=home, uri=uri, table=f"digests/{home}")
        violations += bad
        notes += more
    queues: dict[str, Queue] = {}  # every queue that opens
    unreadable: set[str] = set()
    for name in queue_folders(lake):
        uri = join_uri(lake.root, "queues", name)
        violations += checkpoint_violations(name, uri, lake.options)
        q, bad, more = check_table(lake, name=name, uri=uri)
        violations += bad
        notes += more
        if bad:
            unreadable.add(name)
        elif q is not None:
            queues[name] = q
    # Start offsets (retention): rows below them were removed on purpose. Step 5 checked that
    # every partition holds [start, next); the rows of exactly-once-written queues are read with
    # their own snapshot's starts below.
    starts: dict[tuple[str, str], int] = {}
    for name, q in sorted(queues.items()):
        try:
            starts.update({(name, p): s for p, s in start_offsets(q, snapshot=q.refresh()).items()})
        except STORAGE_ERRORS as exc:
            violations.append(unreadable_violation(exc, table=name, uri=q.uri))

    # Read the backing queues first (see the package docstring on ordering).
    backings: dict[str, Backing] = {}
    for pid, q in backing_queues.items():
        try:
            backings[pid] = read_backing(lake, pid, q)
        except STORAGE_ERRORS as exc:
            violations.append(unreadable_violation(exc, table=f"backing/{pid}", uri=q.uri, processor=pid))
    # The one-commit steps: their records are commit metadata in the queues' logs.
    seen_versions: dict[str, int] = {}
    for name, q in sorted(queues.items()):
        try:
            seen_versions[name] = q.refresh().version()  # before: a newer commit is read as late
            found, bad_commits = commit_records(q)
        except STORAGE_ERRORS as exc:
            violations.append(unreadable_violation(exc, table=name, uri=q.uri))
            continue
        violations += [malformed_commit(b) for b in bad_commits]
        for pid, recs in found.items():
            if pid in backings:
                b = backings[pid]
                b.records = merge(b.records, recs)
            else:
                notes.append(f"{len(recs)} step commit(s) of processor {pid!r} in {name}, which has "
                             "no backing queue: not audited")
    steps: dict[str, Steps] = {}
    known: dict[str, Known] = {}  # hash -> attempt
    snapshot_only: dict[str, Record] = {}  # hash -> trailing snapshot without an attempt
    eo_queues: set[str] = set()
    truncated: set[str] = set()  # processors whose first backing records were retained away
    for pid, b in backings.items():
        # Step 4: the backing queue itself.
        violations += b.violations
        first_step = 0
        if b.start > 0 and b.records:
            first_step = min(r.step for r in b.records)
            truncated.add(pid)
            notes.append(
                f"the backing queue of {pid!r} starts at offset {b.start} (its records below it "
                f"were retained away): its history is audited from step {first_step}, and the "
                "first reads of that step are not checked against R2 (where they start)")
        arranged = arrange(pid, b.records, first_step=first_step)
        violations += arranged.violations
        steps[pid] = arranged
        for rec in arranged.attempts.values():
            known.setdefault(rec.hash, Known(pid, rec))
            eo_queues.update(record_rows(rec))
            violations += alts_violations(pid, rec.snapshot)

        if arranged.pending_snapshot is not None:
            snapshot_only[arranged.pending_snapshot.hash] = arranged.pending_snapshot
            violations += alts_violations(pid, arranged.pending_snapshot.snapshot)

    # A queue that carries an exactly-once processor's ``proc:{p}`` app transaction is its output
    # even when no record names it (records lost: a trimmed log, a damaged backing queue): its
    # rows are checked, so such a lake fails the audit instead of passing unchecked.
    for name, q in sorted(queues.items()):
        try:
            dt = q.refresh()
            if any(dt.transaction_version(proc_app_id(pid)) is not None for pid in backings):
                eo_queues.add(name)
        except STORAGE_ERRORS as exc:
            violations.append(unreadable_violation(exc, table=name, uri=q.uri))
    # Then the queues: rows of every exactly-once-written queue, and input end offsets.
    rows: dict[str, QueueRows] = {}
    for name in sorted(eo_queues):
        if name in unreadable:
            rows[name] = QueueRows(name, True, {}, {}, readable=False)
            continue
        try:
            rows[name] = read_queue_rows(name, queues.get(name), backings)
        except STORAGE_ERRORS as exc:
            violations.append(unreadable_violation(exc, table=name, uri=queues[name].uri))
            rows[name] = QueueRows(name, True, {}, {}, readable=False)
    for name, qr in rows.items():
        starts.update({(name, p): s for p, s in qr.starts.items()})
    ends = input_ends(steps, queues)

    # Attempts appended meanwhile: their hashes are known, their steps are the next audit's.
    late: dict[str, Known] = {}
    for pid, b in backings.items():
        try:
            table = b.queue.read_arrow(partition="0", start=b.cut)
        except STORAGE_ERRORS as exc:
            violations.append(unreadable_violation(exc, table=f"backing/{pid}", uri=b.queue.uri, processor=pid))
            continue
        for rec in parse_records(pid, table)[0]:
            if rec.is_attempt:
                late.setdefault(rec.hash, Known(pid, rec))
    for name, since in seen_versions.items():
        try:
            found, _ = commit_records(queues[name], since=since)
        except STORAGE_ERRORS as exc:
            violations.append(unreadable_violation(exc, table=name, uri=queues[name].uri))
            continue
        for pid, recs in found.items():
            for rec in recs:
                late.setdefault(rec.hash, Known(pid, rec))

    # Step 3: every queue that an attempt names exists.
    for name, qr in rows.items():
        if not qr.exists:
            writers = sorted({k.processor for k in known.values() if name in record_rows(k.record)})
            violations.append(Violation(
                MISSING_QUEUE,
                f"queue {name!r} is named by attempts of {', '.join(writers)} but does not exist",
                queue=name,
            ))  # fmt: skip

    # Step 3: which attempts are delivered (the others are undelivered or pending).
    # Step 3: which steps' rows are below an output partition's start offset (retained, not
    # missing), and whether they fit below it.
    retained = retained_outputs(steps, rows)
    violations += retained.violations
    delivered: dict[str, list[Record]] = {}
    pendings: dict[str, str | None] = {}
    for pid, arranged in steps.items():
        delivered[pid], pendings[pid], bad = delivered_steps(pid, arranged, rows, retained)
        violations += bad
    # Step 2: attribution of every hashed (and unhashed) row.
    violations += attribution_checks(rows, known, late, snapshot_only, graph, backings, notes)
    # Step 3: counts, contiguity and app transactions.
    violations += count_checks(rows, known, retained)
    violations += transaction_checks(rows, known, late)

    # Step 3: no step that read nothing produced rows. Step 4: every staged file an attempt names
    # is in its step's staging folder (of this lake, while recovery may still read it).
    for pid, arranged in steps.items():
        violations += rows_without_input(pid, arranged.attempts.values(), rows)
        violations += staged_file_checks(lake, pid, arranged.attempts.values(), delivered[pid])

    # Step 1: input coverage of delivered steps, and positions across lanes and redeployments.
    summaries: dict[str, ProcessorSummary] = {}
    for pid, arranged in steps.items():
        cover_violations, lags = coverage(pid, delivered[pid], ends)
        violations += cover_violations
        summaries[pid] = _summary(backings[pid], arranged, delivered[pid], pendings[pid], lags)
    try:
        stored = stored_positions(delivered, queues, backings)
    except STORAGE_ERRORS as exc:  # a queue that opened but whose log cannot be read now
        violations.append(unreadable_violation(exc, table="positions", uri=lake.root))
        stored = {}
    violations += position_checks(delivered, stored, starts, frozenset(truncated))

    # Step 6: error rows written by platform failures, in every error queue.
    for name, q in sorted(queues.items()):
        try:
            violations += platform_error_checks({name: q})
        except STORAGE_ERRORS as exc:
            violations.append(unreadable_violation(exc, table=name, uri=q.uri))

    if graph is not None:
        notes += graph_notes(graph, backings)
    all_queues = set(queues) | unreadable
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
        violations=tuple(sort_violations(violations)),
        processors=dict(sorted(summaries.items())),
        queues_checked=tuple(sorted(q for q in eo_queues if rows[q].exists and rows[q].readable)),
        queues_not_checked=tuple(sorted(all_queues - eo_queues)),
        notes=tuple(notes),
        retained_below=retained_below,
        retained_steps={
            "input_ranges_below_start": below_start,
            "output_steps_committed": len(retained.proven),
            "output_steps_by_order": len(retained.by_order),
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
