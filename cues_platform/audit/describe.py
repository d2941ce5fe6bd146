"""A processor's step history in words (``cues backing show``): its backing records and the
one-commit steps read back from its home queue's log."""

from __future__ import annotations

from collections import defaultdict

from cues_platform.audit.backing import outcome_of, read_backing, record_rows
from cues_platform.audit.discovery import backing_folders, backing_uri, check_lake
from cues_platform.audit.errors import NoSuchProcessorError
from cues_platform.audit.storage import STORAGE_ERRORS, open_checked, unreadable_error
from cues_platform.processing.backing import Record, RecordType
from cues_platform.processing.history import commit_records, merge
from cues_platform.queues import Lake
from cues_platform.queues.errors import QueueError
from cues_platform.queues.layout import PROCESSOR_STEP


def describe_backing(lake: Lake, processor: str, *, last: int | None = 20) -> list[str]:
    """The last ``last`` steps of a processor's history, one line per step, e.g.
    ``step 7: reads orders/0 [70, 80) — hash 1a2b3c4d…; one commit (version 9): output 10 rows
    to enriched/0 (committed)`` (a one-commit step) or ``step 8: snapshot of …; attempt: …``
    (a recorded snapshot / attempt). Raises :class:`NoSuchProcessorError` when there is no
    backing queue."""
    check_lake(lake)
    known = backing_folders(lake)
    lanes = sorted(k for k in known if k.startswith(f"{processor}."))
    if lanes:  # a processor over every partition: each lane (partition) in turn
        own = [processor] if processor in known else []
        return [line for lane in [*own, *lanes]
                for line in [f"lane {lane} (partition {lane.partition('.')[2] or '0'}):",
                             *(f"  {x}" for x in _describe_one(lake, lane, last=last))]]
    if processor not in known:
        raise NoSuchProcessorError(
            f"no backing queue for processor {processor!r} in lake {lake.root} (processors with "
            f"one: {', '.join(known) or 'none'}); only exactly-once processors have one",
            processor=processor,
        )
    return _describe_one(lake, processor, last=last)


def _describe_one(lake: Lake, processor: str, *, last: int | None) -> list[str]:
    uri = backing_uri(lake, processor)
    queue = open_checked(lake, processor, uri=uri, table=f"backing/{processor}")
    try:
        b = read_backing(lake, processor, queue)
    except STORAGE_ERRORS as exc:
        raise unreadable_error(exc, table=f"backing/{processor}", uri=uri) from exc
    commits: list[Record] = []
    for name in lake.list_queues():
        try:
            commits += commit_records(lake.queue(name), processor=processor)[0].get(processor, [])
        except STORAGE_ERRORS as exc:
            raise unreadable_error(exc, table=name, uri=lake.queue_uri(name)) from exc
    by_step: dict[int, list[Record]] = defaultdict(list)
    for rec in merge(b.records, commits):
        by_step[rec.step].append(rec)
    shown = sorted(by_step)[-last:] if last else sorted(by_step)
    versions: dict[str, int | None] = {}

    def committed(queue: str, step: int) -> str:
        if queue not in versions:
            try:
                versions[queue] = (
                    lake.queue(queue).refresh().transaction_version(PROCESSOR_STEP.id(processor))
                )
            except QueueError:
                versions[queue] = None
            except STORAGE_ERRORS as exc:
                raise unreadable_error(exc, table=queue, uri=lake.queue_uri(queue)) from exc
        v = versions[queue]
        return "committed" if v is not None and v >= step else "not committed"

    lines = [
        f"backing queue of {processor} at {b.queue.uri}: {len(b.records)} record(s), "
        f"{len(commits)} one-commit step(s), {len(by_step)} step(s), epoch {b.epoch}"
        + (f" (showing the last {len(shown)})" if len(shown) < len(by_step) else "")
    ]
    for step in shown:
        recs = by_step[step]
        snap = recs[0].snapshot
        reads = (
            ", ".join(
                f"{r.queue}/{r.partition} [{r.start}, {r.end})"
                for _, r in sorted(snap.inputs.items())
            )
            or "no inputs"
        )
        alts = f" (alts: {snap.alts})" if snap.alts else ""
        if snap.replay is not None:
            alts += f" (replay of error row {snap.replay})"
        kinds = [r for r in recs if r.type is RecordType.SNAPSHOT]
        head = f"step {step}: {'snapshot of' if kinds else 'reads'} {reads}{alts} — hash {snap.delivery_hash[:8]}…"
        parts = []
        for rec in (r for r in recs if r.is_attempt):
            outcome = outcome_of(rec)
            out = record_rows(rec)
            what = "attempt" if rec.version is None else f"one commit (version {rec.version})"
            if rec.type is RecordType.ATTEMPT_NIL or not out:
                parts.append(f"{what}: nil (no output)")
                continue
            targets = ", ".join(
                f"{n if n >= 0 else '?'} row{'s' if n != 1 else ''} to {q}/{p} ({committed(q, step)})"
                for q, ps in sorted(out.items())
                for p, n in sorted(ps.items())
            )
            err = f" {rec.error!r}" if rec.error else ""
            parts.append(f"{what}: {outcome}{err} {targets}")
        if not parts:
            parts.append("no attempt yet (pending: retried on the next start)")
        lines.append(head + "; " + "; ".join(parts))
    if not by_step:
        lines.append("(no records)")
    return lines
