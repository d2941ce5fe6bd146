"""Step 5 of the audit: every queue and backing table opens, its log is whole and agrees with
its files. An audit fails on what it cannot read: a table that does not open, a commit file that
is empty or does not parse, a data file that the log names but the storage does not have, or a
``part:`` app transaction that disagrees with the files' offsets is a violation naming the table
and the file, never a table skipped.

The same check guards the ``cues`` commands (:func:`open_checked`), and :func:`unreadable_error`
turns a storage exception (delta-rs, the file system, pyarrow) into one
:class:`UnreadableTableError` line that names the table, the file and what to do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyarrow import fs

from cues_platform.audit.errors import UnreadableTableError, UnwritableTableError
from cues_platform.audit.report import CORRUPT_LOG, OUTSIDE_LAKE, UNREADABLE, Violation
from cues_platform.audit.retained import density_violations
from cues_platform.queues import Lake, Queue
from cues_platform.queues.confine import PathOutsideLakeError, confine, is_inside
from cues_platform.queues.errors import (
    LogIntegrityError,
    MissingLogError,
    QueueError,
    QueueNotFoundError,
)
from cues_platform.queues.filesystems import filesystem_for
from cues_platform.queues.integrity import (
    TableStorage,
    diagnose_unloadable,
    find_checkpoint_damage,
)
from cues_platform.queues.names import join_uri

# What the storage raises when a table's log or files are damaged or out of reach.
STORAGE_ERRORS: tuple[type[BaseException], ...] = (DeltaError, OSError, pa.ArrowException)

_COMMIT = re.compile(r"(\d{20})\.json")
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet")
_PATH_IN_TEXT = re.compile(r"""(?:path: "|location: ")?((?:[a-z0-9]+://)?/[^\s"',)]+\.(?:json|parquet|crc))""")


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (delta-rs appends a multi-line backtrace)."""
    text = str(exc).strip().splitlines()
    line = text[0].strip() if text else ""
    line = line or type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."


def file_of(exc: BaseException) -> str | None:
    """The file an exception is about, when it says."""
    name = getattr(exc, "filename", None)
    if isinstance(name, str) and name:
        return name
    match = _PATH_IN_TEXT.search(str(exc))
    return match.group(1) if match else None


def _hint(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, PermissionError) or "ermission denied" in text or "Read-only file" in text:
        return "the lake is not writable (or readable) by this user: fix its permissions or mount"
    if isinstance(exc, NotADirectoryError):
        return "a path inside the lake is a file where a folder belongs: check --lake"
    if isinstance(exc, FileNotFoundError):
        return ("a file that the table's log names is missing: restore it from a backup; do not "
                "write to the table until it is repaired")
    return ("its Delta log or a data file is damaged: restore the named file from a backup (or "
            "run `cues audit` for every problem of the lake); do not write to the table until it "
            "is repaired")


def unreadable_error(exc: BaseException, *, table: str, uri: str) -> UnreadableTableError:
    """One clear error for a storage exception raised while opening or reading ``table``."""
    reason, file = first_line(exc), file_of(exc)
    where = f" (file {file})" if file and file not in reason else ""
    return UnreadableTableError(
        f"cannot read {table} at {uri}: {reason}{where}; {_hint(exc)}",
        table=table, uri=uri, file=file, reason=reason,
    )  # fmt: skip


def unwritable_error(exc: BaseException, *, table: str, uri: str) -> UnwritableTableError:
    """One clear error for a storage exception raised while writing ``table``."""
    reason, file = first_line(exc), file_of(exc)
    where = f" (file {file})" if file and file not in reason else ""
    return UnwritableTableError(
        f"cannot write to {table} at {uri}: {reason}{where}; {_hint(exc)}",
        table=table, uri=uri, file=file, reason=reason,
    )  # fmt: skip


def _filesystem(uri: str, options: Mapping[str, str] | None) -> tuple[fs.FileSystem, str]:
    return filesystem_for(uri, options)


def _has_files(uri: str, options: Mapping[str, str] | None) -> bool:
    filesystem, path = _filesystem(uri, options)
    infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True, recursive=True))
    return any(i.type == fs.FileType.File for i in infos)


def check_table(
    lake: Lake, *, name: str, uri: str, table: str | None = None, processor: str | None = None
) -> tuple[Queue | None, list[Violation], list[str]]:
    """Open the queue ``name`` at ``uri`` and check its log and files.

    Returns the queue (None when it cannot be opened), the violations and notes. ``table`` is how
    reports name it (default: the queue name; ``backing/{processor}`` for backing queues).
    """
    table = table or name

    def bad(kind: str, message: str, *, file: str | None = None, partition: str | None = None) -> Violation:
        return Violation(kind, message, processor=processor, queue=table, partition=partition, file=file)

    try:
        queue = Queue(lake=lake, name=name, uri=uri)
        dt = queue.refresh()
    except (QueueNotFoundError, MissingLogError):
        try:
            has_files = _has_files(uri, lake.options)
        except STORAGE_ERRORS as exc:
            return None, [bad(UNREADABLE, unreadable_error(exc, table=table, uri=uri).message)], []
        if not has_files:
            return None, [], [f"{uri} is an empty folder, not a table: remove it"]
        return None, [bad(
            UNREADABLE,
            f"{table} at {uri} holds data files but no Delta log ({join_uri(uri, '_delta_log')} "
            "is missing): its messages cannot be read; restore _delta_log from a backup, never "
            "recreate the table over the files",
            file=join_uri(uri, "_delta_log"),
        )], []  # fmt: skip
    except (*STORAGE_ERRORS, LogIntegrityError) as exc:
        try:  # name the damaged commit file when the log's own files show it
            damaged = _commit_problems(table, uri, None, lake.options)
        except STORAGE_ERRORS:
            damaged = []
        if damaged:
            return None, [bad(UNREADABLE, m, file=f) for m, f in damaged], []
        return None, [unreadable_violation(exc, table=table, uri=uri, processor=processor)], []
    except QueueError as exc:  # not a cues queue, or a folder whose name no queue can have
        return None, [bad(UNREADABLE, f"{table} at {uri}: {exc}")], []
    problems: list[Violation] = []
    try:
        # Step 5a: the commit files the snapshot is made of (after its checkpoint) are whole.
        problems += [bad(CORRUPT_LOG, m, file=f) for m, f in _commit_problems(table, uri, dt, lake.options)]
        # Step 5b: each partition holds exactly the offsets [start, next): its start offset
        # (retention, ``start:{p}``) and the log's next offset (``part:{p}``) agree with the
        # files (``retained.density_violations``; integrity's own statistics check counts from
        # 0 and is not used: rows retained away are not lost).
        # Step 5d: every data file the log names is inside the table's folder (a forged add
        # action naming /tmp/evil.parquet, an absolute path, a '..', a symlink out of the lake).
        problems += [bad(OUTSIDE_LAKE, m, file=f) for m, f in _files_outside(table, uri, dt)]
        # Step 5c: every data file the log names is there, with the size the log says.
        missing = _missing_files(table, uri, dt, lake.options)
        if missing:  # a maintenance commit may have replaced them since: ask the newest snapshot
            missing = _missing_files(table, uri, queue.refresh(), lake.options)
        problems += [bad(UNREADABLE, m, file=f) for m, f in missing]
        # (5b, last: a partition is read to name its missing offsets only when every file of
        # the table is there and inside it; otherwise the statistics alone.)
        problems += [
            Violation(v.kind, v.message, processor=processor, queue=table, partition=v.partition,
                      offsets=v.offsets)
            for v in density_violations(table, queue, dt, read=not problems)
        ]
    except STORAGE_ERRORS as exc:
        problems.append(unreadable_violation(exc, table=table, uri=uri, processor=processor))
    return queue, problems, []


SYSTEM_TABLES = ("positions", "transactions", "deployments")  # _cues/{name}: plain Delta tables


def checkpoint_violations(table: str, uri: str, options: Mapping[str, str] | None) -> list[Violation]:
    """A torn or missing checkpoint (``integrity.find_checkpoint_damage``), reported even where
    opening the table falls back to an older one (nothing is lost then, but the lake is damaged
    and an operator should know)."""
    storage = TableStorage(uri, options)
    damage = find_checkpoint_damage(storage)
    if damage is None:
        return []
    first = damage.damaged[0][0]
    then = ("the table loads from an older checkpoint (every later commit is there): nothing is "
            "lost; remove or restore the damaged file" if damage.fallback is not None else
            "the table cannot be loaded safely: restore the file from a backup")
    return [Violation(CORRUPT_LOG, f"{table}: damaged checkpoint {damage.describe(storage)}; {then}",
                      queue=table, file=storage.location(first))]


def system_table_checks(lake: Lake) -> list[Violation]:
    """Step 5 for the system tables (``_cues/positions``, ``_cues/transactions``,
    ``_cues/deployments``): each opens, its commits are whole, its files are there. A tailer's
    position or a transaction's decision lost to damage is never passed as OK."""
    out: list[Violation] = []
    for name in SYSTEM_TABLES:
        uri = lake.system_uri(name)
        table = f"_cues/{name}"
        try:
            exists = DeltaTable.is_deltatable(uri, storage_options=lake.options)
            if not exists:
                if _has_files(uri, lake.options):
                    out.append(Violation(UNREADABLE, (
                        f"{table} at {uri} holds files but no loadable Delta log: its positions or "
                        "decisions cannot be read; restore _delta_log from a backup"),
                        queue=table, file=join_uri(uri, "_delta_log")))
                continue
            out += checkpoint_violations(table, uri, lake.options)
            try:
                dt = DeltaTable(uri, storage_options=dict(lake.options) if lake.options else None)
            except DeltaError as exc:
                err = diagnose_unloadable(TableStorage(uri, lake.options), what=table, error=exc,
                                          queue_rules=False)
                out.append(Violation(UNREADABLE, first_line(err), queue=table,
                                     file=getattr(err, "path", None) or getattr(err, "file", None)
                                     or file_of(exc)))
                continue
            out += [Violation(CORRUPT_LOG, m, queue=table, file=f)
                    for m, f in _commit_problems(table, uri, dt, lake.options)]
            out += [Violation(UNREADABLE, m, queue=table, file=f)
                    for m, f in _missing_files(table, uri, dt, lake.options)]
        except STORAGE_ERRORS as exc:
            out.append(unreadable_violation(exc, table=table, uri=uri))
    return out


def unreadable_violation(
    exc: BaseException, *, table: str, uri: str, processor: str | None = None
) -> Violation:
    """A storage exception met while reading ``table``, as an [unreadable] violation."""
    err = unreadable_error(exc, table=table, uri=uri)
    return Violation(UNREADABLE, err.message, processor=processor, queue=table, file=err.file)


def _commit_problems(table: str, uri: str, dt: DeltaTable | None,
                     options: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """Empty or unparsable commit files after the snapshot's checkpoint (``dt`` None: a table
    that does not open; every commit after the newest checkpoint)."""
    filesystem, log = _filesystem(join_uri(uri, "_delta_log"), options)
    infos = filesystem.get_file_info(fs.FileSelector(log, allow_not_found=True))
    commits, checkpoints = {}, []
    for info in infos:
        if m := _COMMIT.fullmatch(info.base_name):
            commits[int(m.group(1))] = info
        elif m := _CHECKPOINT.fullmatch(info.base_name):
            checkpoints.append(int(m.group(1)))
    version = dt.version() if dt is not None else max(commits, default=-1)
    start = max((c for c in checkpoints if c <= version), default=-1) + 1
    problems = []
    for v in range(start, version + 1):
        info = commits.get(v)
        if info is None:
            continue  # a log that skips a version does not open; the opener reports it
        if info.size == 0:
            problems.append((
                f"commit {v} of {table} ({info.path}) is empty: its changes (a batch of messages) "
                "are invisible and the next append would reuse their offsets; restore the file "
                "from a backup and do not write to the table until it is repaired",
                info.path,
            ))  # fmt: skip
            continue
        with filesystem.open_input_stream(info.path) as stream:
            text = stream.read().decode("utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                json.loads(line)
            except ValueError:
                problems.append((
                    f"commit {v} of {table} ({info.path}) is damaged: line {n} is not JSON (a "
                    "truncated or overwritten file); restore it from a backup",
                    info.path,
                ))  # fmt: skip
                break
    return problems


def _add_uris(uri: str, dt: DeltaTable) -> list[tuple[str, str, int | None]]:
    """``(path as logged, full URI, size)`` of every data file the snapshot's log names."""
    adds = dt.get_add_actions(flatten=True)
    if adds.num_rows == 0:
        return []
    out = []
    for p, size in zip(adds["path"].to_pylist(), adds["size_bytes"].to_pylist(), strict=True):
        text = unquote(p)
        full = text if text.startswith("/") or "://" in text else join_uri(uri, text)
        out.append((p, full, size))
    return out


def _files_outside(table: str, uri: str, dt: DeltaTable) -> list[tuple[str, str]]:
    problems = []
    for logged, full, _ in _add_uris(uri, dt):
        try:
            confine(root=uri, path=full)
        except PathOutsideLakeError as exc:
            problems.append((
                f"the log of {table} at version {dt.version()} names data file {logged!r}, which "
                f"is not inside the table's folder ({exc.reason}): its rows are not the "
                "queue's; the commit is damaged or forged: remove it from a copy of the log "
                "(restore the table from a backup) before any processor reads the queue",
                full,
            ))  # fmt: skip
    return problems


def _missing_files(table: str, uri: str, dt: DeltaTable,
                   options: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    found = [(full, size) for _, full, size in _add_uris(uri, dt) if is_inside(root=uri, path=full)]
    if not found:
        return []  # (files outside the table are step 5d's, and are never touched)
    filesystem, _ = _filesystem(uri, options)
    paths = [_filesystem(full, options)[1] for full, _ in found]
    sizes = [size for _, size in found]
    problems = []
    for info, size in zip(filesystem.get_file_info(paths), sizes, strict=True):
        if info.type == fs.FileType.NotFound:
            problems.append((
                f"data file {info.path} of {table} is missing (the log at version {dt.version()} "
                "names it): its messages cannot be read; restore it from a backup",
                info.path,
            ))  # fmt: skip
        elif size is not None and info.size is not None and info.size != size:
            problems.append((
                f"data file {info.path} of {table} has {info.size} bytes but the log says {size}: "
                "it is truncated or overwritten; restore it from a backup",
                info.path,
            ))  # fmt: skip
    return problems


def open_checked(lake: Lake, name: str, *, uri: str | None = None, table: str | None = None) -> Queue:
    """Open a queue for a command, refusing one whose log or files are damaged (the error names
    the table, the file and what to do)."""
    uri = uri or lake.queue_uri(name)
    filesystem, path = _filesystem(uri, lake.options)
    try:
        missing = filesystem.get_file_info(path).type == fs.FileType.NotFound
    except STORAGE_ERRORS as exc:
        raise unreadable_error(exc, table=table or name, uri=uri) from exc
    if missing:
        raise QueueNotFoundError(
            f"queue {name!r} does not exist at {uri}; check the name (`cues queue ls`) and --lake",
            queue=name, uri=uri,
        )  # fmt: skip
    queue, problems, _ = check_table(lake, name=name, uri=uri, table=table)
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more problem(s): run `cues audit`)" if len(problems) > 1 else ""
        raise UnreadableTableError(
            first.message + more, table=table or name, uri=uri, file=first.file, reason=first.kind
        )
    if queue is None:  # an empty folder where the queue should be
        raise QueueNotFoundError(
            f"queue {name!r} does not exist at {uri} (an empty folder); create it first "
            "(Lake.create_queue) or remove the folder", queue=name, uri=uri,
        )  # fmt: skip
    return queue
