"""Step 1 of the audit: input coverage. No step reads offsets the input does not have
([beyond_end]) or an inverted range; what each binding delivered and what is left (the lag).
That every offset is read once and in order, across the lanes of a family and redeployments,
is :mod:`.positions` ([gap], [overlap], [position])."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from cues_platform.audit.report import BEYOND_END, MALFORMED_RECORD, InputLag, Violation
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
        cursor = 0
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
            cursor = max(cursor, r.end)
        lags.append(
            InputLag(binding, queue, part, cursor, available if available is not None else cursor)
        )
    return bad, lags

