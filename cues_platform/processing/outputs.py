"""Turning a function's result into prepared outputs, and committing them.

Preparing materializes the result once (Spark -> Arrow on the driver), conforms it to each output
queue's contract and splits it by partition, in memory. An exactly_once step whose rows all go to
its home queue commits them from memory in its one home commit (``processing/home.py``); one that
writes several queues first stages them as Parquet files under
``{lake}/_cues/staging/{processor}/{step}`` (its attempt record refers to them);
at_least_once/at_most_once append the conformed tables directly (:func:`commit_direct`).
Committing a staged output appends it to its queue in one Delta commit that carries the step's
delivery hash in its rows and the processor's app transaction ``proc:{processor} = step``; a
commit of a step that the queue already has is a no-op, so a roll-forward can never deliver twice.

A staged file is named by an attempt record, which is data in the lake: before any staged file is
read, written or its folder deleted, its path is confined (``queues/confine.py``) to the staging
folder of its own step (``{lake}/_cues/staging/{processor}/{step}-{hash8}``), so a damaged or
forged record can never make recovery read a file from elsewhere (``/tmp/evil.parquet``) into an
output queue: it raises :class:`~cues_platform.queues.confine.PathOutsideLakeError` (a platform
error: nothing is delivered, no error row is written).
"""

from __future__ import annotations

import json
import traceback
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyarrow import fs

from cues_platform.processing.backing import Snapshot
from cues_platform.processing.contracts import rows_as_json
from cues_platform.processing.failures import CONTRACT_EXCEPTION_TYPE, exception_type_of
from cues_platform.processing.model import Out
from cues_platform.queues import Lake, Queue
from cues_platform.queues.appender import AppendResult, append_batches
from cues_platform.queues.by_reference import WrittenPart, append_written
from cues_platform.queues.confine import PathOutsideLakeError, confine
from cues_platform.queues.errors import SchemaError
from cues_platform.queues.filesystems import filesystem_for, join_path
from cues_platform.queues.layout import PROCESSOR_STEP
from cues_platform.queues.names import join_uri
from cues_platform.queues.schema import conform

ERROR_SCHEMA = pa.schema([
    pa.field("processor", pa.string(), nullable=False),
    pa.field("step", pa.int64(), nullable=False),
    pa.field("inputs", pa.string(), nullable=False),
    pa.field("exception_type", pa.string(), nullable=False),
    pa.field("message", pa.string(), nullable=False),
    pa.field("traceback", pa.string(), nullable=False),
    pa.field("failed_at", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("queue", pa.string(), nullable=True),  # contract breaks: the queue whose contract
    pa.field("payload", pa.string(), nullable=True),  # ... and the offending row as JSON
])

Staged = dict[str, dict[str, str]]  # queue -> partition -> staged file URI


def to_arrow(value: Any) -> pa.Table:
    if isinstance(value, pa.Table):
        return value
    if hasattr(value, "toArrow"):  # a Spark DataFrame (classic or Connect)
        return value.toArrow()
    if hasattr(value, "to_dict") and hasattr(value, "columns"):  # pandas
        return pa.Table.from_pandas(value, preserve_index=False)
    return pa.table(value)


def split_outputs(result: Any, outputs: Mapping[str, Out], *, processor: str) -> dict[str, Any]:
    """Map a function's return value to ``{binding: value}`` (None: no output)."""
    if result is None:
        return {}
    if isinstance(result, Mapping):
        unknown = sorted(set(result) - set(outputs))
        if unknown:
            raise SchemaError(f"processor {processor!r} returned outputs {unknown}, which it does not "
                              f"bind; its outputs are {sorted(outputs)}", processor=processor)
        return {b: v for b, v in result.items() if v is not None}
    if len(outputs) != 1:
        raise SchemaError(f"processor {processor!r} has {len(outputs)} outputs: return a dict "
                          f"{{binding: DataFrame}} with keys from {sorted(outputs)}", processor=processor)
    return {next(iter(outputs)): result}


def partitioned(table: pa.Table, out: Out, queue: Queue) -> dict[str, pa.Table]:
    if out.partition_column is None:
        return {out.partition: table}  # type: ignore[dict-item]
    parts: dict[str, pa.Table] = {}
    for value in pc.unique(table[out.partition_column]).to_pylist():
        part = queue.check_partition(str(value))
        parts[part] = table.filter(pc.equal(table[out.partition_column], value))
    return parts


def conformed(queues: Mapping[str, Queue], tables: Mapping[str, Mapping[str, pa.Table]]
              ) -> tuple[dict[str, dict[str, pa.Table]], dict[str, dict[str, int]]]:
    """Conform each non-empty (queue, partition) table to its queue's payload schema (step 3)."""
    out: dict[str, dict[str, pa.Table]] = {}
    counts: dict[str, dict[str, int]] = {}
    for qname, parts in tables.items():
        for part, table in parts.items():
            if table.num_rows == 0:
                continue
            out.setdefault(qname, {})[part] = conform(table, queues[qname].payload_schema, queue=qname,
                                                      max_rows=queues[qname].max_batch_rows)
            counts.setdefault(qname, {})[part] = table.num_rows
    return out, counts


def stage(lake: Lake, snapshot: Snapshot, ready: Mapping[str, Mapping[str, pa.Table]]) -> Staged:
    """Step 4 (exactly_once, an attempt over several queues): write each conformed (queue,
    partition) table as a staged Parquet file that the attempt record refers to."""
    base = _staging_uri(lake, snapshot)  # confined: the processor id comes from the snapshot
    filesystem, root = filesystem_for(base, lake.options)
    filesystem.create_dir(root, recursive=True)
    staged: Staged = {}
    for qname, parts in ready.items():
        for part, table in parts.items():
            # A unique name per attempt: a fenced (older) instance still preparing the same step can
            # never overwrite the files that the newer instance's attempt record refers to.
            name = f"{qname}--{part}--{uuid.uuid4().hex[:12]}.parquet"
            pq.write_table(table, join_path(root, name), filesystem=filesystem)
            # the attempt record keeps the file's URI (a local lake: its path, as before)
            staged.setdefault(qname, {})[part] = join_uri(base, name)
    return staged


def _staging_uri(lake: Lake, snapshot: Snapshot) -> str:
    """The staging folder of one step, confined to the lake's staging area."""
    area = lake.system_uri("staging")
    folder = join_uri(area, snapshot.processor, f"{snapshot.step:012d}-{snapshot.delivery_hash[:8]}")
    return confine(root=lake.root, path=folder, under=area, processor=snapshot.processor,
                   step=snapshot.step, named_by=f"the snapshot of step {snapshot.step} of processor "
                   f"{snapshot.processor!r} (its staging folder)")


STAGING_MARK = "/_cues/staging/"


def read_staged(files: Mapping[str, str], storage_options: Mapping[str, str] | None = None, *,
                lake: Lake | None = None, snapshot: Snapshot | None = None,
                queue: str | None = None) -> dict[str, pa.Table]:
    """``{partition: table}`` of one queue's staged files (raises OSError when one is gone);
    ``storage_options``: the lake's, for staged files on an object store.

    Every file is confined before it is opened (:class:`PathOutsideLakeError` otherwise): with
    ``lake`` and ``snapshot`` (the attempt's), to that step's own staging folder; with ``lake``
    only, to the lake's staging area; with neither (older callers), to the staging area of the
    lake that the path itself names (``.../_cues/staging/...``, no ``..``), which refuses any
    file that is not a staged file but cannot tell this lake from another one."""
    tables = {}
    for part, uri in files.items():
        confine_staged(uri, lake=lake, snapshot=snapshot, queue=queue, partition=part)
        filesystem, path = filesystem_for(uri, storage_options)
        tables[part] = pq.read_table(path, filesystem=filesystem)
    return tables


def confine_staged(uri: str, *, lake: Lake | None, snapshot: Snapshot | None,
                   queue: str | None = None, partition: str | None = None) -> str:
    """``uri`` if it may be read as a staged file (see :func:`read_staged`), else raise
    :class:`PathOutsideLakeError` naming the file and the attempt record that named it."""
    named_by = "a staged-files map"
    data: dict[str, Any] = {"queue": queue, "partition": partition}
    if snapshot is not None:
        named_by = (f"the attempt record of step {snapshot.step} of processor {snapshot.processor!r} "
                    f"(delivery hash {snapshot.delivery_hash})"
                    + (f" for {queue}/{partition}" if queue is not None else ""))
        data.update(processor=snapshot.processor, step=snapshot.step, hash=snapshot.delivery_hash)
    if lake is not None:
        area = _staging_uri(lake, snapshot) if snapshot is not None else lake.system_uri("staging")
        return confine(root=lake.root, path=uri, under=area, named_by=named_by, **data)
    root = uri.split(STAGING_MARK, 1)[0] if isinstance(uri, str) and STAGING_MARK in uri else ""
    if not root or root.endswith(":/"):
        raise PathOutsideLakeError(
            f"refusing file {uri!r} named by {named_by}: it is not a staged file (no "
            f"{STAGING_MARK!r} folder of a lake in its path); nothing was read. A record that "
            "names a file elsewhere is damaged or forged: run `cues audit` on the lake and restore "
            "the record's table before running its processor again",
            path=uri, root=None, area=None, named_by=named_by, reason="not a staged file", **data)
    return confine(root=root, path=uri, under=join_uri(root, "_cues", "staging"), named_by=named_by,
                   **data)


def error_table(snapshot: Snapshot, exc: BaseException) -> pa.Table:
    inputs = json.dumps({b: [r.queue, r.partition, r.start, r.end] for b, r in snapshot.inputs.items()})
    return pa.table({
        "processor": [snapshot.processor], "step": [snapshot.step], "inputs": [inputs],
        "exception_type": [exception_type_of(exc)],
        "message": [str(exc)[:10_000]],
        "traceback": ["".join(traceback.format_exception(exc))[-20_000:]],
        "failed_at": [datetime.now(UTC)],
        "queue": [None], "payload": [None],
    }, schema=ERROR_SCHEMA)


def contract_error_table(snapshot: Snapshot, *, queue: str, bad: pa.Table, reasons: list[str]) -> pa.Table:
    """One error row per row that broke ``queue``'s contract, naming the failed checks."""
    n = bad.num_rows
    inputs = json.dumps({b: [r.queue, r.partition, r.start, r.end] for b, r in snapshot.inputs.items()})
    return pa.table({
        "processor": [snapshot.processor] * n, "step": [snapshot.step] * n, "inputs": [inputs] * n,
        "exception_type": [CONTRACT_EXCEPTION_TYPE] * n,
        "message": [f"row breaks the contract of queue {queue!r}: {r}" for r in reasons],
        "traceback": [""] * n, "failed_at": [datetime.now(UTC)] * n,
        "queue": [queue] * n, "payload": rows_as_json(bad),
    }, schema=ERROR_SCHEMA)


def delivered_to(queue: Queue, processor: str, step: int, dt: DeltaTable | None = None) -> bool:
    version = queue.txn_version(PROCESSOR_STEP.id(processor), snapshot=dt)
    return version is not None and int(version) >= step


def commit_staged(lake: Lake, queue: Queue, snapshot: Snapshot, files: Mapping[str, str],
                  *, message_type: str = "message") -> AppendResult:
    """Step 5: append one queue's staged files in one commit, at most once per step."""
    if delivered_to(queue, snapshot.processor, snapshot.step):
        return AppendResult(queue=queue.name, ranges={}, duplicate=True)
    tables = read_staged(files, lake.options, lake=lake, snapshot=snapshot, queue=queue.name)
    return commit_once(queue, snapshot, tables, prepared=True, message_type=message_type)


def commit_once(queue: Queue, snapshot: Snapshot, tables: Mapping[str, Any], *, prepared: bool,
                message_type: str = "message") -> AppendResult:
    """Append ``{partition: table}`` in one commit carrying the app transaction
    ``proc:{processor} = step``, unless the queue already has this step or a later one."""
    processor, step = snapshot.processor, snapshot.step

    def guard(dt: DeltaTable) -> AppendResult | None:
        if delivered_to(queue, processor, step, dt):
            return AppendResult(queue=queue.name, ranges={}, duplicate=True)
        return None

    return append_batches(queue, tables, guards=[guard], prepared=prepared,
                          app_transactions=[(PROCESSOR_STEP.id(processor), step)],
                          delivery_hash=snapshot.delivery_hash, message_type=message_type,
                          commit_metadata={"cues.processor": processor, "cues.step": str(step)})


def remove_staging(lake: Lake, snapshot: Snapshot) -> None:
    filesystem, root = filesystem_for(_staging_uri(lake, snapshot), lake.options)
    if filesystem.get_file_info(root).type != fs.FileType.NotFound:
        filesystem.delete_dir(root)


def commit_direct(queue: Queue, snapshot: Snapshot, tables: Mapping[str, pa.Table], *,
                  message_type: str = "message") -> AppendResult:
    """The at-least/at-most-once commit: the conformed ``{partition: table}`` appended in one
    commit, straight from memory (no staged file, no re-read) and with no step check (a re-run
    appends again)."""
    metadata = {"cues.processor": snapshot.processor, "cues.step": str(snapshot.step)}
    if tables and all(isinstance(t, WrittenPart) for t in tables.values()):
        return append_written(queue, tables, commit_metadata=metadata,  # type: ignore[arg-type]
                              delivery_hash=snapshot.delivery_hash, message_type=message_type)
    return append_batches(queue, tables, prepared=True, delivery_hash=snapshot.delivery_hash,
                          message_type=message_type, commit_metadata=metadata)
