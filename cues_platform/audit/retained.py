"""Retention and the audit (issue 23): rows below a partition's *start offset* are retained-away,
not lost, and exactly-once is still proven for everything at or above it.

A partition's start offset is its queue's app transaction ``start:{partition}``
(:mod:`cues_platform.queues.retention`; 0 when absent). The retention delete removes the rows
below the new start and moves the start in one Delta commit, so offsets ``[start, next)`` are all
there and offsets ``[0, start)`` were removed on purpose. What the audit does with it:

- **Storage** (:func:`density_violations`, step 5): every partition holds exactly the offsets
  ``[start, next)``, each once (``next`` is the ``part:`` transaction). A hole at or above the
  start, or rows gone below an offset that no ``start:`` transaction names (a plain Delta DELETE,
  a lost file), is [corrupt_log] naming the queue, partition and offsets: an audit fails on what
  it cannot prove, and without the start the lake cannot tell retained rows from lost ones.
  Rows still there below the start are [corrupt_log] too (a start moved without its delete).
- **Outputs** (:func:`retained_outputs`, step 3): a step whose rows in an exactly-once-written
  ``queue/partition`` are gone is *retained* (delivered, its rows below the start) when all of:
  the partition's start is above 0; every earlier step of the processor that names the partition
  is retained too (a processor's commits to a partition are in step order, so retained steps are
  a prefix); and, for the processor's last step, its commit is proven (see below), since
  otherwise it is *pending* as before. The one step of a processor that straddles the start keeps
  its rows from the start on, as one run starting exactly at it. The rows retained steps
  recorded, over all processors, fit below the start (at most ``start`` of them); more is
  [row_count_mismatch] over ``[0, start)``.
  A retained step is *proven* when its record is its commit (a one-commit step: its rows were in
  that commit, and the offsets at or above the start are all there, so they were below it) or,
  for a backing attempt, when the queue's ``proc:{processor}`` reaches it and no later step of
  the processor names the queue; otherwise it is checked *by order and count only* (an attempt
  whose commit was lost before retention removed the offsets around it looks the same, unless
  the count bound catches it). The report counts both.
- **Inputs** (positions, step 1): a processor's first read of a partition may start at or below
  the partition's start (a lane deployed after retention starts at the start offset; offsets
  below it are retained-away, not a gap); a stored position of a partition never read may be the
  start. A delivered step whose input range reaches below the start read rows that are gone: its
  offsets are still checked (R1-R4, beyond_end), its rows cannot be, and the report counts such
  ranges.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from cues_platform.audit.backing import record_rows
from cues_platform.audit.report import CORRUPT_LOG, ROW_COUNT_MISMATCH, Violation
from cues_platform.processing.backing import Record
from cues_platform.queues.based import file_bases, read_delta
from cues_platform.queues.layout import PARTITION as PARTITION_ID
from cues_platform.queues.layout import START
from cues_platform.queues.retention import start_offset
from cues_platform.queues.schema import OFFSET, PARTITION

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from cues_platform.audit.rows import QueueRows
    from cues_platform.audit.sequence import Steps
    from cues_platform.queues import Queue

MAX_RUNS = 20  # missing-offset runs named per partition (the rest are counted)


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for o in offsets:
        if out and out[-1][1] == o:
            out[-1] = (out[-1][0], o + 1)
        else:
            out.append((o, o + 1))
    return out


def _holes(present: list[int], start: int, end: int) -> list[tuple[int, int]]:
    """``[a, b)`` runs of ``[start, end)`` missing from sorted unique ``present``."""
    out, cursor = [], start
    for o in present:
        if o < start:
            continue
        if o >= end:
            break
        if o > cursor:
            out.append((cursor, o))
        cursor = o + 1
    if cursor < end:
        out.append((cursor, end))
    return out


def density_violations(table: str, queue: Queue, dt: DeltaTable, *,
                       read: bool = True) -> list[Violation]:
    """Every partition of ``dt`` holds exactly the offsets ``[start, next)``, each once.

    From the add actions' statistics (rows, lowest and highest offset per file); a partition
    whose statistics disagree is read (its ``_offset`` column only) to name the offsets, unless
    ``read`` is False (a file of the table is missing or outside it: the statistics only)."""
    adds = dt.get_add_actions(flatten=True)
    names = set(adds.column_names)
    stats: dict[str, tuple[int, int | None, int | None]] = {}  # partition -> rows, lo, hi
    part_col, lo_col, hi_col = f"partition.{PARTITION}", f"min.{OFFSET}", f"max.{OFFSET}"
    if adds.num_rows and part_col in names:
        rows = adds["num_records"].to_pylist()
        los = adds[lo_col].to_pylist() if lo_col in names else [None] * adds.num_rows
        his = adds[hi_col].to_pylist() if hi_col in names else [None] * adds.num_rows
        bases = file_bases(pa.table(adds)).to_pylist()  # based offsets (queues/based.py)
        los = [v if v is None else v + b for v, b in zip(los, bases, strict=True)]
        his = [v if v is None else v + b for v, b in zip(his, bases, strict=True)]
        for p, n, lo, hi in zip(adds[part_col].to_pylist(), rows, los, his, strict=True):
            count, low, high = stats.get(p, (0, None, None))
            stats[p] = (count + int(n or 0),
                        lo if low is None else (low if lo is None else min(low, lo)),
                        hi if high is None else (high if hi is None else max(high, hi)))
    bad: list[Violation] = []
    for p in sorted(set(queue.partitions) | set(stats), key=str):
        count, lo, hi = stats.get(p, (0, None, None))
        start = start_offset(queue, p, snapshot=dt) if p in queue.partitions else 0
        declared = queue.txn_version(PARTITION_ID.id(p), snapshot=dt)
        end = int(declared) if declared is not None else max(start, -1 if hi is None else hi + 1)
        if end < start:
            bad.append(Violation(
                CORRUPT_LOG,
                f"{table}/{p}: its start offset {start} ({START.id(p)}) is past its next offset "
                f"{end} ({PARTITION_ID.id(p)}): no retention commit sets that; the log is damaged or "
                "forged: restore the table from a backup",
                queue=table, partition=p, offsets=(end, start),
            ))  # fmt: skip
            continue
        if count == end - start and (count == 0 or (lo == start and hi == end - 1)):
            continue
        if not read:
            bad.append(Violation(
                CORRUPT_LOG,
                f"{table}/{p} should hold offsets [{start}, {end}) ({end - start} row(s): start "
                f"offset {start}, next offset {end}) but its files hold {count} row(s)"
                + (f" with offsets {lo}..{hi}" if lo is not None and hi is not None else "")
                + "; restore the missing data from a backup",
                queue=table, partition=p, offsets=(start, end),
            ))  # fmt: skip
            continue
        bad += _name_offsets(table, dt, p, start=start, end=end,
                             statistics=lo is not None and hi is not None)
    return bad


def _name_offsets(table: str, dt: DeltaTable, p: str, *, start: int, end: int,
                  statistics: bool) -> list[Violation]:
    """Read ``p``'s offsets and name what is missing, repeated or left below the start."""
    got = read_delta(dt, columns=[OFFSET], filter=pc.field(PARTITION) == p)
    offsets = sorted(got[OFFSET].to_pylist())
    unique = sorted(set(offsets))
    where = f"{table}/{p}"
    bad: list[Violation] = []
    holes = _holes(unique, start, end)
    for a, b in holes[:MAX_RUNS]:
        if start == 0:
            why = (f"its start offset is 0 (no {START.id(p)} transaction: no retention commit "
                   "removed them), so they were deleted outside retention (a plain Delta DELETE) "
                   "or a data file was lost, and the audit cannot tell retained rows from lost "
                   "ones")
        else:
            why = (f"they are at or above its start offset {start} ({START.id(p)}), which "
                   "retention never removes: they were deleted outside retention or lost")
        bad.append(Violation(
            CORRUPT_LOG,
            f"offsets [{a}, {b}) of {where} are missing (the log's next offset is {end}): {why}; "
            "restore them from a backup before any reader reads the partition",
            queue=table, partition=p, offsets=(a, b),
        ))  # fmt: skip
    if len(holes) > MAX_RUNS:
        missing = sum(b - a for a, b in holes[MAX_RUNS:])
        bad.append(Violation(
            CORRUPT_LOG, f"... and {len(holes) - MAX_RUNS} more run(s) of missing offsets of "
            f"{where} ({missing} offset(s))", queue=table, partition=p,
            offsets=(holes[MAX_RUNS][0], holes[-1][1])))
    below = [o for o in unique if o < start]
    if below:
        bad.append(Violation(
            CORRUPT_LOG,
            f"{where} still holds {len(below)} row(s) below its start offset {start} (offsets "
            f"{below[0]}..{below[-1]}): the start moved without the retention delete that goes "
            "with it (one commit does both); the log is damaged or forged",
            queue=table, partition=p, offsets=(below[0], below[-1] + 1),
        ))  # fmt: skip
    above = [o for o in unique if o >= end]
    if above:
        bad.append(Violation(
            CORRUPT_LOG,
            f"{where} holds {len(above)} row(s) at or past its next offset {end} (offsets "
            f"{above[0]}..{above[-1]}): the next append would reuse them",
            queue=table, partition=p, offsets=(above[0], above[-1] + 1),
        ))  # fmt: skip
    repeated = len(offsets) - len(unique)
    if repeated:
        twice = sorted(o for o, k in Counter(offsets).items() if k > 1)
        bad.append(Violation(
            CORRUPT_LOG,
            f"{where} holds {repeated} row(s) whose offset another row has (offsets "
            f"{twice[0]}..{twice[-1]}): offsets are never reused",
            queue=table, partition=p, offsets=(twice[0], twice[-1] + 1),
        ))  # fmt: skip
    if not bad and statistics:  # the statistics disagree but the rows are fine: name them
        bad.append(Violation(
            CORRUPT_LOG,
            f"the file statistics of {where} disagree with its rows (offsets [{start}, {end}) "
            "are all there): a data file's statistics are damaged; restore it from a backup",
            queue=table, partition=p))
    return bad


@dataclass
class Retained:
    """What :func:`retained_outputs` found."""

    full: set[tuple[str, str, str]] = field(default_factory=set)  # (hash, queue, partition)
    partial: dict[tuple[str, str, str], int] = field(default_factory=dict)  # -> rows below start
    proven: set[str] = field(default_factory=set)  # hashes of retained steps whose commit is known
    by_order: set[str] = field(default_factory=set)  # the others: checked by order and count
    violations: list[Violation] = field(default_factory=list)

    def explains(self, h: str, queue: str, partition: str) -> bool:
        return (h, queue, partition) in self.full

    def missing_queue_retained(self, rec: Record, queue: str) -> bool:
        """Every partition of ``queue`` that ``rec`` recorded rows for is retained."""
        parts = [p for p, n in record_rows(rec).get(queue, {}).items() if n != 0]
        return bool(parts) and all((rec.hash, queue, p) in self.full for p in parts)


def retained_outputs(steps: Mapping[str, Steps], rows: Mapping[str, QueueRows]) -> Retained:
    """Which steps' rows in exactly-once-written partitions are below the start (module
    docstring), and the count bound."""
    out = Retained()
    below: dict[tuple[str, str], int] = defaultdict(int)  # (queue, partition) -> rows retained
    who: dict[tuple[str, str], list[str]] = defaultdict(list)
    for pid, arranged in sorted(steps.items()):
        attempts = [arranged.attempts[s] for s in sorted(arranged.attempts)]
        last = attempts[-1].step if attempts and arranged.pending_snapshot is None else None
        lanes: dict[tuple[str, str], list[tuple[Record, int]]] = defaultdict(list)
        for rec in attempts:
            for q, parts in record_rows(rec).items():
                for p, n in parts.items():
                    if n != 0:
                        lanes[(q, p)].append((rec, n))
        for (q, p), recs in sorted(lanes.items()):
            qr = rows.get(q)
            if qr is None or not qr.exists or not qr.readable:
                continue
            start = qr.starts.get(p, 0)
            if start <= 0:
                continue
            last_in_queue = max(r.step for r in attempts if q in record_rows(r))
            reached = qr.versions.get(pid)
            for rec, n in recs:
                runs = qr.runs.get((p, rec.hash))
                if runs:
                    total = sum(r.rows for r in runs)
                    if runs[0].start == start and len(runs) == 1 and 0 <= total < n:
                        out.partial[(rec.hash, q, p)] = n - total
                        below[(q, p)] += n - total
                        who[(q, p)].append(f"{pid!r} step {rec.step}")
                        _proof(out, rec, committed=True)
                    break  # later steps of the processor are above the start: checked as ever
                committed = rec.version is not None or (
                    rec.step == last_in_queue and reached is not None and reached >= rec.step)
                if rec.step == last and not committed:
                    break  # pending (recovery rolls it forward), not retained
                out.full.add((rec.hash, q, p))
                below[(q, p)] += max(n, 0)
                who[(q, p)].append(f"{pid!r} step {rec.step}")
                _proof(out, rec, committed=committed)
    for (q, p), n in sorted(below.items()):
        start = rows[q].starts.get(p, 0)
        if n > start:
            steps_text = ", ".join(who[(q, p)][:10]) + (" ..." if len(who[(q, p)]) > 10 else "")
            out.violations.append(Violation(
                ROW_COUNT_MISMATCH,
                f"the steps whose rows in {q}/{p} are gone ({steps_text}) recorded {n} row(s), "
                f"but only offsets [0, {start}) were retained away (its start offset is {start}): "
                f"at least {n - start} recorded row(s) were never committed or were lost",
                queue=q, partition=p, offsets=(0, start),
            ))  # fmt: skip
    out.by_order -= out.proven
    return out


def _proof(out: Retained, rec: Record, *, committed: bool) -> None:
    (out.proven if committed else out.by_order).add(rec.hash)
