"""Step 3 of the audit: once only. For each (queue, partition, hash) the rows equal the
attempt's recorded count ([delivered_twice] when more, [row_count_mismatch] when fewer) and form
one contiguous offset range ([not_contiguous]); an attempt followed by later steps has all its
commits ([undelivered]); each queue's app transaction ``proc:{processor}`` agrees with the steps
whose rows it holds ([app_transaction])."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from cues_platform.audit.backing import Known, outcome_of, record_rows
from cues_platform.audit.report import (
    APP_TRANSACTION,
    DELIVERED_TWICE,
    NOT_CONTIGUOUS,
    ROW_COUNT_MISMATCH,
    UNDELIVERED,
    Violation,
)
from cues_platform.audit.retained import Retained
from cues_platform.audit.rows import QueueRows
from cues_platform.audit.sequence import Steps
from cues_platform.processing.backing import Record
from cues_platform.queues.layout import PROCESSOR_STEP


def count_checks(rows: Mapping[str, QueueRows], known: Mapping[str, Known],
                 retained: Retained | None = None) -> list[Violation]:
    """Row counts and contiguity of every attributed (queue, partition, hash). ``retained``: the
    steps whose rows are (partly) below the start offset (:mod:`.retained`), not missing."""
    retained = retained or Retained()
    bad: list[Violation] = []
    for name, qr in rows.items():
        for (part, h), runs in sorted(qr.runs.items()):
            k = known.get(h)
            expected = None if k is None else record_rows(k.record).get(name, {}).get(part)
            if k is None or expected is None:
                continue  # step 2 reports it
            pid, rec = k.processor, k.record
            total = sum(r.rows for r in runs)
            span = (runs[0].start, runs[-1].end)
            runs_text = ", ".join(f"[{r.start}, {r.end})" for r in runs)
            if expected >= 0 and total > expected:
                first = runs[0]
                extra = [(r.start, r.end) for r in runs[1:]]
                if first.rows > expected:
                    extra.insert(0, (first.start + expected, first.end))
                for start, end in extra:
                    bad.append(Violation(
                        DELIVERED_TWICE,
                        f"step {rec.step} of {pid!r} is delivered more than once in "
                        f"{name}/{part}: {total} rows with its hash where the attempt recorded "
                        f"{expected} (runs {runs_text}); rows [{start}, {end}) repeat it",
                        processor=pid, queue=name, partition=part, offsets=(start, end), hash=h,
                        step=rec.step,
                    ))  # fmt: skip
            elif expected >= 0 and total < expected and (
                    retained.partial.get((h, name, part)) != expected - total):
                bad.append(Violation(
                    ROW_COUNT_MISMATCH,
                    f"step {rec.step} of {pid!r} has {total} row(s) in {name}/{part} but its "
                    f"attempt recorded {expected} (runs {runs_text})",
                    processor=pid, queue=name, partition=part, offsets=span, hash=h, step=rec.step,
                ))  # fmt: skip
            elif len(runs) > 1:
                bad.append(Violation(
                    NOT_CONTIGUOUS,
                    f"step {rec.step} of {pid!r} has its {total} row(s) in {name}/{part} split "
                    f"into runs {runs_text}; one commit gives one contiguous range",
                    processor=pid, queue=name, partition=part, offsets=span, hash=h, step=rec.step,
                ))  # fmt: skip
        # Partitions an attempt names in a queue that holds some of its rows but not these.
        present = defaultdict(set)
        for part, h in qr.runs:
            present[h].add(part)
        for h, parts in present.items():
            k = known.get(h)
            if k is None:
                continue
            for part, n in sorted(record_rows(k.record).get(name, {}).items()):
                if part not in parts and n != 0 and not retained.explains(h, name, part):
                    bad.append(Violation(
                        ROW_COUNT_MISMATCH,
                        f"step {k.record.step} of {k.processor!r} recorded {n} row(s) for "
                        f"{name}/{part} but none are there, while its other partitions of "
                        f"{name} are (one commit writes them all)",
                        processor=k.processor, queue=name, partition=part, hash=h,
                        step=k.record.step,
                    ))  # fmt: skip
    return bad


def delivered_steps(
    pid: str, arranged: Steps, rows: Mapping[str, QueueRows], retained: Retained | None = None
) -> tuple[list[Record], str | None, list[Violation]]:
    """Delivered attempts in step order, the pending work in words, and undelivered attempts.
    A queue whose rows of the step are all below its start offset (``retained``) holds them."""
    retained = retained or Retained()
    got: list[Record] = []
    bad: list[Violation] = []
    pending: str | None = None
    last_step = max(arranged.attempts, default=None)
    for step in sorted(arranged.attempts):
        rec = arranged.attempts[step]
        # A queue that step 5 found unreadable cannot show the commit: not reported twice.
        missing = [
            q for q in sorted(record_rows(rec)) if rows[q].readable and rec.hash not in rows[q].hashes
            and not retained.missing_queue_retained(rec, q)
        ]
        if not missing:
            got.append(rec)
            continue
        if step == last_step and arranged.pending_snapshot is None:
            pending = (
                f"step {step}: attempt ({outcome_of(rec)}) recorded, commit to "
                f"{', '.join(missing)} not yet made (recovery rolls it forward)"
            )
            continue
        for q in missing:
            bad.append(Violation(
                UNDELIVERED,
                f"step {step}'s attempt ({outcome_of(rec)}) names queue {q!r} but no row of it "
                f"carries hash {rec.hash}, and later steps followed: its output was lost",
                processor=pid, queue=q, step=step, hash=rec.hash,
                partition=next(iter(record_rows(rec)[q]), None),
            ))  # fmt: skip
    if arranged.pending_snapshot is not None:
        snap = arranged.pending_snapshot.snapshot
        reads = ", ".join(
            f"{r.queue}/{r.partition} [{r.start}, {r.end})" for _, r in sorted(snap.inputs.items())
        )
        pending = (
            f"step {snap.step}: snapshot of {reads} recorded, no attempt yet (retried on start)"
        )
    return got, pending, bad


def transaction_checks(
    rows: Mapping[str, QueueRows], known: Mapping[str, Known], late: Mapping[str, Known]
) -> list[Violation]:
    bad: list[Violation] = []
    for name, qr in rows.items():
        top: dict[str, int] = {}
        for _, h in qr.runs:
            k = known.get(h)
            if k is not None and name in record_rows(k.record):
                top[k.processor] = max(top.get(k.processor, -1), k.record.step)
        # Every step commits its home queue (rows or empty), so the app transaction may name any
        # recorded step of the processor, not only one with rows in this queue.
        named: dict[str, int] = {}
        for k in [*known.values(), *late.values()]:
            named[k.processor] = max(named.get(k.processor, -1), k.record.step)
        for pid, version in sorted(qr.versions.items()):
            highest = top.get(pid)
            if highest is not None and (version is None or version < highest):
                bad.append(Violation(
                    APP_TRANSACTION,
                    f"{name} holds rows of step {highest} of {pid!r} but its app transaction "
                    f"{PROCESSOR_STEP.id(pid)} is {version}: a roll-forward would commit that step again",
                    processor=pid, queue=name, step=highest,
                ))  # fmt: skip
            elif version is not None and version > named.get(pid, -1):
                bad.append(Violation(
                    APP_TRANSACTION,
                    f"{name}'s app transaction {PROCESSOR_STEP.id(pid)} is {version}, but {pid!r} has "
                    f"no attempt of step {version} or later",
                    processor=pid, queue=name, step=int(version),
                ))  # fmt: skip
    return bad

