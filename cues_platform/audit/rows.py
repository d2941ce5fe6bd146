"""Reading the rows of exactly-once-written queues, projected to ``_delivery_hash``,
``_partition``, ``_offset`` (plus ``processor`` for error queues) and grouped, vectorized, into
contiguous offset runs per (partition, hash); rows without a hash as runs per partition."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cues_platform.queues import Queue
from cues_platform.queues.based import read_delta
from cues_platform.queues.layout import PROCESSOR_STEP
from cues_platform.queues.retention import start_offsets
from cues_platform.queues.schema import DELIVERY_HASH, MESSAGE_TYPE, OFFSET, PARTITION


@dataclass(frozen=True)
class Run:
    """Contiguous rows of one (partition, hash) in a queue."""

    partition: str
    hash: str
    start: int
    end: int  # exclusive
    processors: tuple[str, ...] = ()  # the `processor` column of error rows, when present

    @property
    def rows(self) -> int:
        return self.end - self.start


@dataclass
class QueueRows:
    name: str
    exists: bool
    runs: dict[tuple[str, str], list[Run]]  # (partition, hash) -> runs in offset order
    versions: dict[str, int | None]  # processor -> proc:{processor} app transaction
    unhashed: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # partition -> runs
    readable: bool = True  # False: step 5 reported the table; its rows are not checked
    hashes: frozenset[str] = frozenset()
    starts: dict[str, int] = field(default_factory=dict)  # partition -> start offset (retention)

    def __post_init__(self) -> None:
        self.hashes = frozenset(h for _, h in self.runs)


def hash_runs(table: pa.Table, with_processor: bool) -> dict[tuple[str, str], list[Run]]:
    """Group rows by (partition, hash) into contiguous offset runs, vectorized."""
    table = table.filter(pc.is_valid(table[DELIVERY_HASH]))
    if table.num_rows == 0:
        return {}
    table = table.sort_by(
        [(PARTITION, "ascending"), (DELIVERY_HASH, "ascending"), (OFFSET, "ascending")]
    )
    part = table[PARTITION].combine_chunks()
    hashes = table[DELIVERY_HASH].combine_chunks()
    offsets = table[OFFSET].to_numpy()
    n = table.num_rows
    new_run = np.ones(n, dtype=bool)
    if n > 1:
        same_part = pc.equal(part[1:], part[:-1]).to_numpy(zero_copy_only=False)
        same_hash = pc.equal(hashes[1:], hashes[:-1]).to_numpy(zero_copy_only=False)
        consecutive = offsets[1:] == offsets[:-1] + 1
        new_run[1:] = ~(same_part & same_hash & consecutive)
    starts = np.flatnonzero(new_run)
    ends = np.append(starts[1:], n)
    procs = table["processor"].combine_chunks() if with_processor else None
    out: dict[tuple[str, str], list[Run]] = defaultdict(list)
    part_list = part.take(pa.array(starts)).to_pylist()
    hash_list = hashes.take(pa.array(starts)).to_pylist()
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        names: tuple[str, ...] = ()
        if procs is not None:
            names = tuple(sorted({p for p in procs[s:e].to_pylist() if p is not None}))
        out[(part_list[i], hash_list[i])].append(
            Run(part_list[i], hash_list[i], int(offsets[s]), int(offsets[e - 1]) + 1, names)
        )
    return dict(out)


def unhashed_runs(table: pa.Table) -> dict[str, list[tuple[int, int]]]:
    """Offset runs ``[start, end)`` per partition of the rows without a delivery hash."""
    table = table.filter(pc.is_null(table[DELIVERY_HASH]))
    if table.num_rows == 0:
        return {}
    table = table.sort_by([(PARTITION, "ascending"), (OFFSET, "ascending")])
    parts = table[PARTITION].to_pylist()
    offsets = table[OFFSET].to_pylist()
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for p, o in zip(parts, offsets, strict=True):
        runs = out[p]
        if runs and runs[-1][1] == o:
            runs[-1] = (runs[-1][0], o + 1)
        else:
            runs.append((o, o + 1))
    return dict(out)


def read_queue_rows(name: str, queue: Queue | None, processors: Iterable[str]) -> QueueRows:
    """The hash runs of an exactly-once-written queue (``queue`` None: it does not exist)."""
    if queue is None:
        return QueueRows(name, False, {}, {})
    dt = queue.refresh()
    columns = [DELIVERY_HASH, PARTITION, OFFSET]
    names = set(queue.payload_schema.names)
    with_processor = {"processor", "step", "exception_type"} <= names
    if with_processor:
        columns += [MESSAGE_TYPE, "processor"]
    table = read_delta(dt, columns=columns)  # offsets absolute whatever the layout (based.py)
    versions = {p: dt.transaction_version(PROCESSOR_STEP.id(p)) for p in processors}
    return QueueRows(
        name, True, hash_runs(table, with_processor), versions, unhashed=unhashed_runs(table),
        starts=start_offsets(queue, snapshot=dt),  # the same snapshot as the rows
    )
