"""Step 4 of the audit: the step history itself (backing records merged with the one-commit steps'
home commits). Steps are numbered 0, 1, 2, ... each with one attempt, preceded by a snapshot of
the same hash where one was recorded (a sink; older versions); an attempt without a snapshot
(the snapshot folded into it, or a home commit) must be the next step ([step_sequence]); alts
snapshots read only the chosen binding ([alts_not_empty])."""

from __future__ import annotations

from dataclasses import dataclass

from cues_platform.audit.report import ALTS_NOT_EMPTY, MALFORMED_RECORD, STEP_SEQUENCE, Violation
from cues_platform.processing.backing import Record, RecordType, Snapshot


@dataclass
class Steps:
    """A processor's records arranged as steps."""

    attempts: dict[int, Record]  # step -> the (first) attempt
    pending_snapshot: Record | None  # trailing snapshot without an attempt
    violations: list[Violation]


def arrange(processor: str, records: list[Record], *, first_step: int = 0) -> Steps:
    """``first_step``: the step the history starts at (0; later when the backing queue's first
    records were retained away)."""
    attempts: dict[int, Record] = {}
    bad: list[Violation] = []
    open_snapshot: Record | None = None
    next_step = first_step
    for rec in records:
        if rec.type is RecordType.SNAPSHOT:
            if open_snapshot is not None and open_snapshot.hash == rec.hash:
                continue  # the same snapshot recorded again: harmless
            if open_snapshot is not None:
                bad.append(Violation(
                    STEP_SEQUENCE,
                    f"step {open_snapshot.step} (backing offset {open_snapshot.offset}) was "
                    f"abandoned: a snapshot of step {rec.step} was recorded (offset {rec.offset}) "
                    "before any attempt of it",
                    processor=processor, step=open_snapshot.step, hash=open_snapshot.hash,
                ))  # fmt: skip
            elif rec.step != next_step:
                bad.append(Violation(
                    STEP_SEQUENCE,
                    f"snapshot at backing offset {rec.offset} is step {rec.step}; the next step "
                    f"should be {next_step}",
                    processor=processor, step=rec.step, hash=rec.hash,
                ))  # fmt: skip
            open_snapshot = rec
            continue
        if rec.step in attempts:
            bad.append(Violation(
                STEP_SEQUENCE,
                f"step {rec.step} has a second attempt ({where(attempts[rec.step])} and "
                f"{where(rec)}); only the first counts",
                processor=processor, step=rec.step, hash=rec.hash,
            ))  # fmt: skip
        elif open_snapshot is None and rec.step != next_step:
            bad.append(Violation(
                STEP_SEQUENCE,
                f"attempt {where(rec)} is step {rec.step}; the next step should be {next_step}",
                processor=processor, step=rec.step, hash=rec.hash,
            ))  # fmt: skip
        elif open_snapshot is not None and open_snapshot.hash != rec.hash:
            bad.append(Violation(
                STEP_SEQUENCE,
                f"attempt {where(rec)} (step {rec.step}) does not follow a "
                "snapshot of the same step and hash",
                processor=processor, step=rec.step, hash=rec.hash,
            ))  # fmt: skip
        if rec.step not in attempts:
            attempts[rec.step] = rec
        open_snapshot = None
        next_step = max(next_step, rec.step + 1)
    return Steps(attempts, open_snapshot, bad)


def where(rec: Record) -> str:
    if rec.version is not None:
        return f"in home commit {rec.version}"
    return f"at backing offset {rec.offset}"


def alts_violations(processor: str, snapshot: Snapshot) -> list[Violation]:
    if snapshot.alts is None:
        return []
    if snapshot.alts not in snapshot.inputs:
        return [Violation(
            MALFORMED_RECORD,
            f"alts snapshot of step {snapshot.step} chose binding {snapshot.alts!r}, which it does "
            f"not read (bindings: {sorted(snapshot.inputs)})",
            processor=processor, step=snapshot.step, hash=snapshot.delivery_hash,
        )]  # fmt: skip
    return [
        Violation(
            ALTS_NOT_EMPTY,
            f"alts step {snapshot.step} chose binding {snapshot.alts!r} but also reads "
            f"{r.size} offset(s) of binding {b!r}",
            processor=processor,
            queue=r.queue,
            partition=r.partition,
            offsets=(r.start, r.end),
            step=snapshot.step,
            hash=snapshot.delivery_hash,
        )  # fmt: skip
        for b, r in sorted(snapshot.inputs.items())
        if b != snapshot.alts and r.size
    ]
