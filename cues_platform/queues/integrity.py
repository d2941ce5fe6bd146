"""Does a queue's log agree with its files? Checks shared by the appender and the auditor.

A queue's offsets are dense per partition, from 0, and the app transaction ``part:{p}`` of the
newest commit holds the next offset of partition ``p``. A storage fault (an emptied or truncated
newest commit, a lost data file) breaks that agreement; appending on top of it would reuse or
skip offsets, so the appender refuses and the auditor reports it.

Known gap (to close): an emptied newest commit makes its batch vanish *consistently* (its files
and its ``part:`` transaction both disappear), which these statistics cannot see; it needs a check
of the commit entries themselves (every commit the platform writes carries commitInfo).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from deltalake import DeltaTable

from cues_platform.queues.schema import OFFSET, PARTITION

PARTITION_TXN = "part:"


@dataclass(frozen=True)
class Inconsistency:
    """One disagreement between a queue's log and its files."""

    queue: str
    partition: str | None
    kind: str  # "offsets": part: app transaction vs the files' offsets; "rows": counts differ
    detail: str

    def __str__(self) -> str:
        where = f"queue {self.queue!r}" + (f" partition {self.partition!r}" if self.partition else "")
        return f"{where}: {self.detail}"


def find_inconsistencies(queue: str, dt: DeltaTable, partitions: Iterable[str]) -> list[Inconsistency]:
    """Compare each declared partition's ``part:`` app transaction with its files' rows and offsets.

    Reads only the snapshot's add actions (file statistics), never the data.
    """
    adds = dt.get_add_actions(flatten=True)
    names = set(adds.column_names)
    part_col, max_col = f"partition.{PARTITION}", f"max.{OFFSET}"
    files: dict[str, tuple[int, int | None]] = {}  # partition -> (rows, max offset)
    if adds.num_rows and part_col in names:
        parts = adds[part_col].to_pylist()
        rows = adds["num_records"].to_pylist()
        maxes = adds[max_col].to_pylist() if max_col in names else [None] * len(parts)
        for p, n, m in zip(parts, rows, maxes, strict=True):
            count, top = files.get(p, (0, None))
            files[p] = (count + int(n or 0), top if m is None else max(m, top if top is not None else m))
    problems: list[Inconsistency] = []
    declared = {p: int(v) for p in partitions
                if (v := dt.transaction_version(f"{PARTITION_TXN}{p}")) is not None}
    for p in sorted(set(declared) | set(files)):
        nxt = declared.get(p, 0)
        count, top = files.get(p, (0, None))
        if count != nxt:
            problems.append(Inconsistency(
                queue, p, "rows",
                f"the log says the next offset is {nxt} but the files hold {count} row(s): a commit "
                "or data file is missing or damaged; restore it from a backup or run `cues audit` "
                "for details, and do not append until it is repaired"))
        elif top is not None and top + 1 != nxt:
            problems.append(Inconsistency(
                queue, p, "offsets",
                f"the log says the next offset is {nxt} but the highest stored offset is {top}"))
    return problems


__all__ = ["Inconsistency", "find_inconsistencies"]
