"""Raw access to the lake for the independent checker: ``deltalake`` and pyarrow only, the layout
(``{root}/queues/{name}``, ``{root}/_cues/...``) and the metadata columns re-implemented from their
documented meaning (see ``checker.py``), never the platform's reader.

Floor: the bottom of the checker, with ``verdict``; ``checker``, ``timecheck`` and the time
nemesis (``timewarp.footprint``) import it.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from cues_platform.jepsen import workload as w
from cues_platform.queues.layout import START


def is_table(path: Path) -> bool:
    return (path / "_delta_log").is_dir()


def open_table(path: Path) -> DeltaTable | None:
    return DeltaTable(str(path)) if is_table(path) else None


def read_table(path: Path, columns: list[str] | None = None) -> pa.Table | None:
    """The rows the table holds now (the current snapshot). Rows a retention delete removed are
    gone: the checker never reads them back from older versions (a real deployment's log
    retention trims those), it proves them from what a deployment keeps (``Expectation``).

    A queue with based offsets (format "2") has a second partition column ``_base`` and a row's
    offset is ``_base + _offset``: read here from the Delta format itself (not through the
    platform's reader), and returned as ``_offset`` without ``_base``."""
    dt = open_table(path)
    if dt is None:
        return None
    names = set(pa.schema(dt.schema()).names)
    wanted = None if columns is None else [c for c in columns if c in names]
    based = "_base" in dt.metadata().partition_columns
    if based and wanted is not None and "_offset" in wanted:
        wanted = [*wanted, "_base"]
    table = dt.to_pyarrow_table(columns=wanted)
    if based and "_offset" in table.column_names:
        at = table.column_names.index("_offset")
        table = table.set_column(at, table.schema.field("_offset"),
                                 pc.add(table["_offset"], table["_base"]))
    return table.drop_columns(["_base"]) if "_base" in table.column_names else table


def start_offset(dt: DeltaTable, partition: str) -> int:
    """The partition's start offset: the app transaction ``start:{partition}`` (0 when absent);
    rows below it were removed by retention on purpose."""
    v = dt.transaction_version(START.id(partition))
    return 0 if v is None else int(v)


def footprint(path: Path) -> dict:
    """What a queue costs on disk: live bytes (files the current snapshot references), removed
    bytes (Parquet files on disk that it does not: compacted or retained away, waiting for
    vacuum's real-time retention, or an append's files not committed yet), ``_delta_log``
    entries (commits in all; since the newest checkpoint) and the newest checkpoint's bytes."""
    dt = DeltaTable(str(path))
    adds = dt.get_add_actions(flatten=True)
    live_paths = {unquote(p) for p in adds["path"].to_pylist()}
    live = sum(adds["size_bytes"].to_pylist())
    removed = removed_files = 0
    for folder, dirs, files in os.walk(path):
        if "_delta_log" in dirs:
            dirs.remove("_delta_log")
        for name in files:
            if name.endswith(".parquet"):
                rel = os.path.relpath(os.path.join(folder, name), path)
                if rel not in live_paths:
                    removed += os.path.getsize(os.path.join(folder, name))
                    removed_files += 1
    log = path / "_delta_log"
    names = os.listdir(log)
    commits = [int(n[:20]) for n in names if n.endswith(".json") and n[:20].isdigit()]
    checkpoints = [n for n in names if ".checkpoint." in n and n.endswith(".parquet")]
    cp_version = max((int(n[:20]) for n in checkpoints), default=-1)
    cp_bytes = sum(os.path.getsize(log / n) for n in checkpoints if int(n[:20]) == cp_version)
    return {"version": dt.version(), "live_bytes": live, "live_files": adds.num_rows,
            "removed_bytes": removed, "removed_files": removed_files, "log_entries": len(commits),
            "entries_since_checkpoint": sum(v > cp_version for v in commits),
            "checkpoint_version": cp_version, "checkpoint_bytes": cp_bytes,
            "checkpoint_app_transactions": sum(
                _checkpoint_txns(log / n) for n in checkpoints if int(n[:20]) == cp_version),
            "checkpoint_tombstones": sum(
                _checkpoint_txns(log / n, action="remove") for n in checkpoints if int(n[:20]) == cp_version),
            "checkpoint_rows": sum(_checkpoint_rows(log / n) for n in checkpoints if int(n[:20]) == cp_version)}


def _checkpoint_rows(file: Path) -> int:
    return pq.ParquetFile(file).metadata.num_rows


def _checkpoint_txns(file: Path, *, action: str = "txn") -> int:
    """App transactions (``txn`` actions; or another action, e.g. ``remove``: the tombstones kept
    for ``delta.deletedFileRetentionDuration``, judged by delta-rs on the real clock) a checkpoint
    file holds: every snapshot load reads them."""
    if action not in pq.read_schema(file).names:
        return 0
    return pq.read_table(file, columns=[action])[action].is_valid().to_pylist().count(True)


def tables_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if is_table(p)) if folder.is_dir() else []


def key_queue(root: Path, name: str) -> Path:
    return root / "queues" / name


def bag(root: Path, queue: str) -> Counter[str]:
    table = read_table(key_queue(root, queue), ["key"])
    return Counter() if table is None else Counter(table["key"].to_pylist())


def retained(root: Path, queue: str) -> bool:
    """True when retention moved the start of some partition of ``queue``."""
    dt = open_table(key_queue(root, queue))
    return dt is not None and any(start_offset(dt, p) for p in w.PARTITIONS)


def sink_table(root: Path) -> pa.Table | None:
    return read_table(root / w.SINK_TABLE)


def error_rows(root: Path) -> list[dict]:
    table = read_table(key_queue(root, w.ERRORS), ["processor", "step", "inputs", "exception_type", "_offset"])
    return [] if table is None else table.to_pylist()


def keys_by_offset(root: Path, queue: str, table: pa.Table | None = None) -> dict[tuple[str, int], str]:
    """(partition, offset) -> key of every row of ``queue`` (an offset is per partition)."""
    table = read_table(key_queue(root, queue), ["key", "_partition", "_offset"]) if table is None else table
    if table is None:
        return {}
    return dict(zip(zip(table["_partition"].to_pylist(), table["_offset"].to_pylist(), strict=True),
                    table["key"].to_pylist(), strict=True))
