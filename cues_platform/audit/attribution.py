"""Step 2 of the audit: attribution. Every row with a delivery hash in a queue that an
exactly-once processor writes carries the hash of an attempt of some processor ([unknown_hash])
and lands in a queue and partition that attempt names ([unexpected_output]). Rows without a hash
in such a queue were written outside the protocol ([no_delivery_hash]): a plain producer or
append into a processor's output, which its readers cannot tell from the processor's rows."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from cues_platform.audit.backing import Backing, Known, names, record_rows
from cues_platform.audit.report import NO_DELIVERY_HASH, UNEXPECTED_OUTPUT, UNKNOWN_HASH, Violation
from cues_platform.audit.rows import QueueRows, Run
from cues_platform.processing.backing import Record
from cues_platform.processing.graph import Graph, Strategy


def attribution_checks(
    rows: Mapping[str, QueueRows],
    known: Mapping[str, Known],
    late: Mapping[str, Known],
    snapshot_only: Mapping[str, Record],
    graph: Graph | None,
    backings: Mapping[str, Backing],
    notes: list[str],
) -> list[Violation]:
    bad: list[Violation] = []
    not_audited: Counter[tuple[str, str]] = Counter()
    for name, qr in rows.items():
        for (part, h), runs in sorted(qr.runs.items()):
            total = sum(r.rows for r in runs)
            k = known.get(h)
            if k is None:
                if h in late:
                    continue  # appended after the audit read the backing queues
                reason = non_eo_writer(runs, graph, backings)
                if reason is not None:
                    not_audited[(name, reason)] += total
                    continue
                bad += _unknown(name, part, h, runs, snapshot_only.get(h))
                continue
            pid, rec = k.processor, k.record
            if record_rows(rec).get(name, {}).get(part) is None:
                bad.append(Violation(
                    UNEXPECTED_OUTPUT,
                    f"{total} row(s) of step {rec.step} of {pid!r} landed in {name}/{part}, which "
                    f"its attempt does not name (it names {names(record_rows(rec))})",
                    processor=pid, queue=name, partition=part,
                    offsets=(runs[0].start, runs[-1].end), hash=h, step=rec.step,
                ))  # fmt: skip
        bad += _unhashed(name, qr, known)
    for (name, reason), n in sorted(not_audited.items()):
        notes.append(f"{n} row(s) of {name} with hashes not audited: {reason}")
    return bad


def _unknown(name: str, part: str, h: str, runs: list[Run], snap: Record | None) -> list[Violation]:
    bad = []
    for run in runs:
        if snap is not None:
            msg = (
                f"{run.rows} row(s) carry the hash of step {snap.step} of processor "
                f"{snap.snapshot.processor!r}, which has a snapshot but no attempt: "
                "rows were committed before the attempt was recorded"
            )
        else:
            msg = (
                f"{run.rows} row(s) carry a delivery hash that no attempt of any "
                "exactly-once processor recorded"
            )
        bad.append(Violation(
            UNKNOWN_HASH, msg, queue=name, partition=part,
            offsets=(run.start, run.end), hash=h,
            processor=snap.snapshot.processor if snap is not None else None,
            step=snap.step if snap is not None else None,
        ))  # fmt: skip
    return bad


def _unhashed(name: str, qr: QueueRows, known: Mapping[str, Known]) -> list[Violation]:
    writers = sorted({k.processor for k in known.values() if name in record_rows(k.record)})
    by = ", ".join(repr(w) for w in writers) or "an exactly-once processor"
    return [
        Violation(
            NO_DELIVERY_HASH,
            f"{end - start} row(s) of {name}/{part} have no delivery hash, but {name} is an "
            f"exactly-once output (of {by}): they were appended outside the step protocol (a "
            "producer or a plain append), and its readers cannot tell them from the processor's "
            "rows; write such data to a queue of its own",
            queue=name, partition=part, offsets=(start, end),
            processor=writers[0] if len(writers) == 1 else None,
        )  # fmt: skip
        for part, runs in sorted(qr.unhashed.items())
        for start, end in runs
    ]


def non_eo_writer(
    runs: list[Run], graph: Graph | None, backings: Mapping[str, Backing]
) -> str | None:
    """Why rows with an unknown hash are legitimately unaudited (error rows of a processor that
    is not exactly-once), or None when they are not."""
    procs = {p for r in runs for p in r.processors}
    if not procs or len(procs) != 1 or any(len(r.processors) != 1 for r in runs):
        return None
    (name,) = procs
    if name in backings:
        return None  # an exactly-once processor: its hashes must be its attempts'
    if graph is None:
        return f"error rows of processor {name!r}, which has no backing queue (not exactly-once)"
    proc = graph.processors.get(name)
    if proc is not None and proc.strategy is not Strategy.EXACTLY_ONCE:
        return f"error rows of {proc.strategy.value} processor {name!r}"
    return None
