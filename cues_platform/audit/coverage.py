"""Step 1 of the audit: input coverage. Every offset of every input partition, from 0 to the end
of the processor's last delivered step, is read by exactly one delivered step ([gap],
[overlap]); no step reads offsets the input does not have ([beyond_end])."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from cues_platform.audit.report import (
    BEYOND_END,
    GAP,
    MALFORMED_RECORD,
    OVERLAP,
    InputLag,
    Violation,
)
from cues_platform.audit.sequence import Steps
from cues_platform.processing.backing import Range, Record
from cues_platform.queues import Queue


def input_ends(
    steps: Mapping[str, Steps], queues: Mapping[str, Queue]
) -> dict[tuple[str, str], int | None]:
    """The next offset of every input partition that a snapshot reads (None: the queue is
    missing or unreadable, which step 5 or the attribution reports)."""
    ends: dict[tuple[str, str], int | None] = {}
    for arranged in steps.values():
        snaps = [r.snapshot for r in arranged.attempts.values()]
        if arranged.pending_snapshot is not None:
            snaps.append(arranged.pending_snapshot.snapshot)
        for snap in snaps:
            for r in snap.inputs.values():
                key = (r.queue, r.partition)
                if key in ends:
                    continue
                q = queues.get(r.queue)
                ends[key] = None if q is None else q.next_offset(r.partition)
    return ends


def coverage(
    pid: str, delivered: list[Record], input_ends: Mapping[tuple[str, str], int | None]
) -> tuple[list[Violation], list[InputLag]]:
    bad: list[Violation] = []
    by_binding: dict[tuple[str, str, str], list[tuple[Range, int]]] = defaultdict(list)
    for rec in delivered:
        for binding, r in rec.snapshot.inputs.items():
            by_binding[(binding, r.queue, r.partition)].append((r, rec.step))
    lags = []
    for (binding, queue, part), ranges in sorted(by_binding.items()):
        available = input_ends.get((queue, part))
        cursor, cursor_step = 0, None
        for r, step in sorted(ranges, key=lambda x: (x[0].start, x[0].end, x[1])):
            if r.size < 0:
                bad.append(Violation(
                    MALFORMED_RECORD, f"step {step} reads the inverted range [{r.start}, {r.end})",
                    processor=pid, queue=queue, partition=part, offsets=(r.start, r.end), step=step,
                ))  # fmt: skip
                continue
            if r.size == 0:
                continue
            if available is not None and r.end > available:
                bad.append(Violation(
                    BEYOND_END,
                    f"step {step} read [{r.start}, {r.end}) of {queue}/{part}, which only has "
                    f"{available} offset(s)",
                    processor=pid, queue=queue, partition=part,
                    offsets=(max(r.start, available), r.end), step=step,
                ))  # fmt: skip
            if r.start > cursor:
                after = "the start" if cursor_step is None else f"step {cursor_step}"
                bad.append(Violation(
                    GAP,
                    f"offsets [{cursor}, {r.start}) of {queue}/{part} were never delivered by "
                    f"{pid!r} (binding {binding!r}): {after} ends at {cursor}, step {step} "
                    f"starts at {r.start}",
                    processor=pid, queue=queue, partition=part, offsets=(cursor, r.start), step=step,
                ))  # fmt: skip
            elif r.start < cursor:
                bad.append(Violation(
                    OVERLAP,
                    f"offsets [{r.start}, {min(cursor, r.end)}) of {queue}/{part} were delivered "
                    f"twice by {pid!r} (binding {binding!r}): by step {cursor_step} and by step {step}",
                    processor=pid, queue=queue, partition=part,
                    offsets=(r.start, min(cursor, r.end)), step=step,
                ))  # fmt: skip
            if r.end >= cursor:
                cursor, cursor_step = r.end, step
        lags.append(
            InputLag(binding, queue, part, cursor, available if available is not None else cursor)
        )
    return bad, lags

