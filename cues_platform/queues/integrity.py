"""Does a queue's log agree with itself and with its files? Checks shared by appender and auditor.

A queue's offsets are dense per partition, from 0, and the app transaction ``part:{p}`` of the
newest commit holds the next offset of partition ``p``. A storage fault breaks that agreement and
appending on top of it would reuse or skip offsets, so the appender refuses
(:class:`LogIntegrityError`) and the auditor reports it. Three kinds of damage are found:

(a) **statistics**: a partition's ``part:`` transaction disagrees with the rows and offsets its
    files hold (read from the snapshot's add actions, never the data);
(b) **commit entries**: a commit file that is empty, not JSON (truncated), has no ``commitInfo``,
    or adds data files without the ``cues.ranges`` metadata the appender writes, or whose
    declared rows (``operationMetrics.num_added_rows``, ``cues.ranges``) disagree with its add
    actions' row counts and offsets or its ``part:`` transactions (an emptied newest commit makes its batch vanish *consistently*, which (a)
    cannot see; (b) can);
(c) **missing data files**: a file the snapshot references is not in storage.

Cost: the appender checks (b) and (c) only for commits its handle has not seen yet (one small
JSON read and one stat per new data file), see :meth:`Queue.ensure_appendable`. The full check,
:func:`find_inconsistencies` (or :func:`verify_log` on a handle), reads every commit entry since
the newest checkpoint and stats every data file: it is for the auditor and ``cues audit``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from cues_platform.queues.based import file_bases
from cues_platform.queues.errors import LogIntegrityError
from cues_platform.queues.layout import PARTITION as PARTITION_ID
from cues_platform.queues.layout import RANGES_KEY, RETENTION_KEY, START
from cues_platform.queues.schema import BASE, OFFSET, PARTITION

LOG_DIR = "_delta_log"
REPAIR_HINT = (
    "restore it from a backup (or a replica) and do not append to the queue until it is "
    "repaired; `cues audit` lists every damaged entry"
)


@dataclass(frozen=True)
class Inconsistency:
    """One disagreement between a queue's log and its files.

    ``kind``: ``"rows"`` / ``"offsets"`` (a ``part:`` transaction vs the files' statistics),
    ``"commit"`` (a damaged commit entry), ``"missing-file"`` (a referenced data file is gone).
    ``path`` is the damaged commit or the missing file, relative to the table, when known.
    """

    queue: str
    partition: str | None
    kind: str
    detail: str
    path: str | None = None
    version: int | None = None

    def __str__(self) -> str:
        where = f"queue {self.queue!r}" + (f" partition {self.partition!r}" if self.partition else "")
        return f"{where}: {self.detail}"


# -- storage access (local paths directly, remote stores through delta-rs' object store) -----------
class TableStorage:
    """Raw reads under one table's folder: commit entries, file existence, listings."""

    def __init__(self, uri: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.uri = uri.rstrip("/")
        local = "://" not in uri or uri.startswith("file://")
        self._root = Path(uri.removeprefix("file://")) if local else None
        self._handler: Any = None
        if not local:
            from deltalake.fs import DeltaStorageHandler

            self._handler = DeltaStorageHandler(self.uri, dict(storage_options or {}))

    @classmethod
    def of(cls, dt: DeltaTable) -> TableStorage:
        return cls(dt.table_uri, getattr(dt, "_storage_options", None))

    def location(self, rel: str) -> str:
        return f"{self.uri}/{rel}"

    def read(self, rel: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        if self._root is not None:
            try:
                return (self._root / rel).read_bytes()
            except FileNotFoundError:
                return None
        from pyarrow import fs

        if self._handler.get_file_info([rel])[0].type == fs.FileType.NotFound:
            return None
        with self._handler.open_input_stream(rel) as stream:
            return bytes(stream.read())

    def move(self, src: str, dst: str) -> None:
        """Rename a file (one already moved by another process is fine)."""
        if self._root is not None:
            try:
                os.replace(self._root / src, self._root / dst)
            except FileNotFoundError:
                return
        else:
            try:
                self._handler.move(src, dst)
            except FileNotFoundError:
                return

    def missing(self, rels: Iterable[str]) -> list[str]:
        """Those of ``rels`` that do not exist."""
        rels = list(rels)
        if self._root is not None:
            return [r for r in rels if not os.path.exists(self._root / r)]
        from pyarrow import fs

        infos = self._handler.get_file_info(rels) if rels else []
        return [r for r, i in zip(rels, infos, strict=True) if i.type == fs.FileType.NotFound]

    def delete(self, rels: Iterable[str]) -> None:
        """Delete files (one already gone, e.g. deleted by another process, is fine)."""
        for rel in rels:
            if self._root is not None:
                (self._root / rel).unlink(missing_ok=True)
            else:
                try:
                    self._handler.delete_file(rel)
                except FileNotFoundError:
                    continue

    def log_entries(self) -> list[str]:
        """Names of the files in ``_delta_log`` (not recursive)."""
        if self._root is not None:
            folder = self._root / LOG_DIR
            return sorted(os.listdir(folder)) if folder.is_dir() else []
        from pyarrow import fs

        infos = self._handler.get_file_info_selector(
            fs.FileSelector(LOG_DIR, allow_not_found=True, recursive=False))
        return sorted(i.base_name for i in infos if i.type == fs.FileType.File)

    def files(self) -> list[str]:
        """Every file under the folder (relative paths), empty when the folder does not exist."""
        if self._root is not None:
            if not self._root.is_dir():
                return []
            return sorted(
                str(Path(d, f).relative_to(self._root))
                for d, _, names in os.walk(self._root) for f in names
            )
        from pyarrow import fs

        infos = self._handler.get_file_info_selector(
            fs.FileSelector("", allow_not_found=True, recursive=True))
        return sorted(i.path for i in infos if i.type == fs.FileType.File)


def commit_path(version: int) -> str:
    return f"{LOG_DIR}/{version:020d}.json"


def handle_is_current(log_dir: Path, version: int) -> bool | None:
    """Where a local table handle at ``version`` stands, from two stats and no listing: True when
    it is the newest (no entry ``version + 1``), False when newer commits exist, None when the log
    was trimmed past it (its own entry is gone: a log cleanup removed it and perhaps the entries
    after it, so it must be opened again from the newest checkpoint; updating it entry by entry
    would find nothing and keep it stale)."""
    if not (log_dir / f"{version:020d}.json").exists():
        return None
    return not (log_dir / f"{version + 1:020d}.json").exists()


def is_log_in_progress(rel: str) -> bool:
    """A temporary file of a commit being written (delta-rs writes ``_delta_log/_commit_*``)."""
    name = rel.rsplit("/", 1)[-1]
    return rel.startswith(f"{LOG_DIR}/") and (name.startswith("_commit_") or name.endswith(".tmp"))


def leftover_content(uri: str, storage_options: Mapping[str, str] | None = None) -> list[str]:
    """Files under a folder that holds no Delta table, other than a commit being written.

    Non-empty means the folder is not new: its log was lost (or it is something else), and
    creating a table there would hide (and let vacuum delete) what it holds.
    """
    return [r for r in TableStorage(uri, storage_options).files() if not is_log_in_progress(r)]


# -- (b) and (c): commit entries ---------------------------------------------------------------------
def _parse_ranges(text: str) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for item in filter(None, text.split(";")):
        part, _, span = item.rpartition(":")
        start, _, end = span.partition("-")
        out[part] = (int(start), int(end))
    return out


def check_commit(
    queue: str, version: int, raw: bytes | None, *, storage: TableStorage | None = None,
    queue_rules: bool = True,
) -> list[Inconsistency]:
    """Problems of one commit entry (``raw`` is its bytes, None when the file is missing); with
    ``storage``, also the data files it adds that are missing.

    ``queue_rules``: also the rules only a queue's appender keeps (``cues.ranges`` on every data
    commit, ranges agreeing with the add actions and ``part:`` transactions). System tables
    (positions, the transaction coordinator) are written without them, so for those only the
    structure counts: a healthy system commit is never blamed."""
    path = commit_path(version)

    def problem(detail: str, partition: str | None = None) -> Inconsistency:
        return Inconsistency(queue, partition, "commit", f"commit {path} (version {version}) "
                             f"{detail}; {REPAIR_HINT}", path=path, version=version)

    if raw is None:
        return [problem("is missing from the log")]
    lines = [ln for ln in raw.decode("utf-8", errors="replace").splitlines() if ln.strip()]
    if not lines:
        return [problem("is empty: the commit it held was lost")]
    actions: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        try:
            action = json.loads(line)
        except ValueError:
            return [problem(f"is truncated or not JSON at line {number}")]
        if not isinstance(action, dict):
            return [problem(f"has a line that is not a Delta action (line {number})")]
        actions.append(action)
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), None)
    if not isinstance(info, dict):
        return [problem("has no commitInfo: part of the entry was lost")]
    if len(actions) == 1 and (lost := _lost_actions(info)):
        # cut down to its commitInfo line: delta-rs loads it as a commit that changed nothing, so
        # the rows it added are invisible and the next append would reuse their offsets
        return [problem(f"holds only its commitInfo, which declares {lost}: its actions were "
                        "lost (the rows it added are invisible and their offsets would be reused)")]
    adds = [a["add"] for a in actions if isinstance(a.get("add"), dict)]
    written = [a for a in adds if a.get("dataChange", True)]
    txns = {t["appId"]: int(t["version"]) for a in actions
            if isinstance(t := a.get("txn"), dict) and str(t.get("appId", "")).startswith(PARTITION_ID.prefix)}
    problems: list[Inconsistency] = []
    metrics = info.get("operationMetrics")
    declared_rows = metrics.get("num_added_rows") if isinstance(metrics, dict) else None
    if isinstance(declared_rows, int):
        stored = sum(_num_records(a) for a in adds)
        if stored != declared_rows:
            problems.append(problem(
                f"declares {declared_rows} added row(s) (operationMetrics) but its add actions "
                f"hold {stored}"))
    ranges_text = info.get(RANGES_KEY)
    if not queue_rules:
        pass
    elif ranges_text is None and RETENTION_KEY in info:
        problems += _check_retention(str(info[RETENTION_KEY]), written, problem)
    elif ranges_text is None:
        if written:
            problems.append(problem(
                f"adds {len(written)} data file(s) but has no {RANGES_KEY} metadata: it was not "
                "written by the queue's appender, or its metadata was lost"))
    else:
        try:
            ranges = _parse_ranges(str(ranges_text))
        except ValueError:
            return [problem(f"has an unreadable {RANGES_KEY} {ranges_text!r}")]
        problems += _check_ranges(ranges, written, txns, problem)
    if storage is not None:
        gone = storage.missing(str(a["path"]) for a in adds if "path" in a)
        problems += [Inconsistency(
            queue, None, "missing-file",
            f"data file {storage.location(rel)} of commit {path} is missing; {REPAIR_HINT}",
            path=rel, version=version) for rel in gone]
    return problems


def _check_retention(text: str, written: list[dict[str, Any]],
                     problem: Any) -> list[Inconsistency]:
    """A retention delete may add only rewritten rows at or above its partitions' new starts."""
    try:
        moves = json.loads(text)
        starts = {str(p): int(v[1]) for p, v in moves.items()}
    except (ValueError, TypeError, AttributeError, IndexError, KeyError):
        return [problem(f"has an unreadable {RETENTION_KEY} {text!r}")]
    out = []
    for add in written:
        values = add.get("partitionValues") or {}
        part = values.get(PARTITION)
        try:
            low = int(json.loads(add.get("stats") or "{}").get("minValues", {}).get(OFFSET))
            low += int(values.get(BASE) or 0)  # based offsets (based.py): the file's _base
        except (ValueError, TypeError):
            low = None
        if part not in starts or low is None or low < starts[part]:
            out.append(problem(f"is a retention delete ({RETENTION_KEY} {text}) that adds a file "
                               f"of partition {part!r} with rows below its new start"))
    return out


# commitInfo keys the platform writes only on a commit that also carries app transactions
# (a processor's at-least-once nil step writes cues.step/cues.hash with no action at all)
_TXN_KEYS = ("cues.producer", "cues.txn", "cues.epoch", "cues.snapshot")


def _lost_actions(info: dict[str, Any]) -> str | None:
    """What a commitInfo says its commit held, when that cannot be nothing; None for a commit
    that may legitimately hold no action (an empty write with no app transaction).

    delta-rs writes ``operationMetrics`` with ``num_added_files``/``num_added_rows`` (snake case;
    ``numAddedFiles``/``numOutputRows`` elsewhere); the platform's own metadata
    (``cues.ranges``, a producer, a delivery hash, a transaction) always comes with actions."""
    metrics = info.get("operationMetrics")
    metrics = metrics if isinstance(metrics, dict) else {}
    for key, what in (("num_added_rows", "row(s)"), ("numOutputRows", "row(s)"),
                      ("num_added_files", "added file(s)"), ("numAddedFiles", "added file(s)"),
                      ("num_removed_files", "removed file(s)"), ("numRemovedFiles", "removed file(s)")):
        value = metrics.get(key)
        if isinstance(value, int) and value > 0:
            return f"{value} {what} ({info.get('operation', 'an operation')})"
    ranges = info.get(RANGES_KEY)
    if isinstance(ranges, str) and ranges:
        return f"offsets {ranges} ({RANGES_KEY})"
    for key in _TXN_KEYS:
        if key in info:
            return f"{key} = {info[key]!r}, which is always written with app transactions"
    return None


def _num_records(add: dict[str, Any]) -> int:
    stats = json.loads(add["stats"]) if isinstance(add.get("stats"), str) else {}
    return int(stats.get("numRecords", 0))


def _check_ranges(ranges: dict[str, tuple[int, int]], adds: list[dict[str, Any]],
                  txns: dict[str, int], problem: Any) -> list[Inconsistency]:
    rows: dict[str, int] = {}
    bounds: dict[str, tuple[int, int]] = {}
    for add in adds:
        values = add.get("partitionValues") or {}
        part = values.get(PARTITION)
        base = int(values.get(BASE) or 0)  # based offsets (based.py): the file's _base
        stats = json.loads(add["stats"]) if isinstance(add.get("stats"), str) else {}
        rows[part] = rows.get(part, 0) + int(stats.get("numRecords", 0))
        lo, hi = (stats.get("minValues") or {}).get(OFFSET), (stats.get("maxValues") or {}).get(OFFSET)
        if lo is not None and hi is not None:
            lo, hi = int(lo) + base, int(hi) + base
            old = bounds.get(part, (lo, hi))
            bounds[part] = (min(old[0], lo), max(old[1], hi))
    out = []
    for part in sorted(set(ranges) | set(rows), key=str):
        start, end = ranges.get(part, (0, 0))
        if part not in ranges:
            out.append(problem(f"adds {rows[part]} row(s) to partition {part!r}, which its "
                               f"{RANGES_KEY} does not declare", part))
            continue
        if rows.get(part, 0) != end - start:
            out.append(problem(f"declares offsets [{start}, {end}) ({end - start} row(s)) of "
                               f"partition {part!r} but its data files hold {rows.get(part, 0)}", part))
        elif part in bounds and bounds[part] != (start, end - 1):
            out.append(problem(f"declares offsets [{start}, {end}) of partition {part!r} but its "
                               f"files hold offsets {bounds[part][0]}..{bounds[part][1]}", part))
        if txns.get(PARTITION_ID.id(part)) != end:
            out.append(problem(f"declares offsets [{start}, {end}) of partition {part!r} but its "
                               f"{PARTITION_ID.id(part)} transaction is "
                               f"{txns.get(PARTITION_ID.id(part), 'missing')}", part))
    return out


def check_commits(
    queue: str, storage: TableStorage, versions: Iterable[int], *, files: bool = True,
    queue_rules: bool = True,
) -> list[Inconsistency]:
    """:func:`check_commit` for each of ``versions``. A missing entry is damage, unless a
    checkpoint at or after it exists (log cleanup removes entries a checkpoint superseded)."""
    out: list[Inconsistency] = []
    checkpoint: int | None = None
    versions = list(versions)
    for version in versions:
        raw = storage.read(commit_path(version))
        if raw is None:
            if checkpoint is None:
                found = newest_checkpoint(storage, max(versions))
                checkpoint = -1 if found is None else found
            if version <= checkpoint:
                continue
        out += check_commit(queue, version, raw, storage=storage if files else None,
                            queue_rules=queue_rules)
    return out


def newest_checkpoint(storage: TableStorage, upto: int) -> int | None:
    """The newest checkpoint version at or below ``upto`` (None when there is none)."""
    return max((v for v in checkpoint_files(storage) if v <= upto), default=None)


# -- checkpoints: torn or missing, and the fallback that is provably safe ----------------------------
CHECKPOINT_HINT = f"{LOG_DIR}/_last_checkpoint"
# a damaged checkpoint is moved aside under this prefix (no Delta reader takes it for a log file)
DAMAGED_PREFIX = "_damaged."
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d+)\.(\d+))?\.parquet$")


def checkpoint_files(storage: TableStorage) -> dict[int, list[str]]:
    """The checkpoint files in the log (names, not paths) by version (classic and multi-part)."""
    out: dict[int, list[str]] = {}
    for name in storage.log_entries():
        if (found := _CHECKPOINT.match(name)) is not None:
            out.setdefault(int(found.group(1)), []).append(name)
    return out


def checkpoint_problem(storage: TableStorage, names: list[str]) -> str | None:
    """Why the checkpoint made of ``names`` cannot be loaded (a torn Parquet footer, a missing
    part of a multi-part checkpoint), or None when every part reads."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = {int(m.group(3)) for n in names if (m := _CHECKPOINT.match(n)) and m.group(3)}
    if parts and len(names) != max(parts):
        return f"has {len(names)} of its {max(parts)} parts"
    for name in sorted(names):
        raw = storage.read(f"{LOG_DIR}/{name}")
        if raw is None:
            return f"part {name} is missing"
        try:
            pq.read_metadata(pa.BufferReader(raw))
        except (pa.ArrowException, OSError) as exc:
            return f"is torn (not a readable Parquet file: {str(exc).splitlines()[0]})"
    return None


def _hinted_version(storage: TableStorage) -> int | None:
    """The version ``_last_checkpoint`` names (None: no hint, or one delta-rs ignores)."""
    raw = storage.read(CHECKPOINT_HINT)
    if raw is None:
        return None
    try:
        version = json.loads(raw)["version"]
    except (ValueError, KeyError, TypeError):
        return None
    return version if isinstance(version, int) else None


def _structure_problem(raw: bytes | None) -> str | None:
    """Why a commit entry cannot be loaded at all (missing, empty, not JSON), else None."""
    if raw is None:
        return "is missing"
    lines = [ln for ln in raw.decode("utf-8", errors="replace").splitlines() if ln.strip()]
    if not lines:
        return "is empty"
    for number, line in enumerate(lines, 1):
        try:
            if not isinstance(json.loads(line), dict):
                return f"has a line that is not a Delta action (line {number})"
        except ValueError:
            return f"is truncated or not JSON at line {number}"
    return None


@dataclass(frozen=True)
class CheckpointDamage:
    """The log's damaged checkpoints and where the table can safely load from instead.

    ``damaged``: ``(relative path, detail)`` of each unreadable checkpoint file and of a
    ``_last_checkpoint`` that names no readable checkpoint. ``fallback``: the newest readable
    checkpoint version from which every later commit entry exists and parses (-1: from version
    0), or None when there is none; then ``blocker`` names the first commit that is missing or
    unreadable above the newest readable checkpoint."""

    damaged: tuple[tuple[str, str], ...]
    fallback: int | None
    blocker: tuple[str, str] | None = None

    def describe(self, storage: TableStorage) -> str:
        return "; ".join(f"{storage.location(rel)} {detail}" for rel, detail in self.damaged)


def find_checkpoint_damage(storage: TableStorage) -> CheckpointDamage | None:
    """None when every checkpoint reads and ``_last_checkpoint`` names one; else what is damaged
    and the safe fallback point (see :class:`CheckpointDamage`). Reads every checkpoint's footer
    and, when one is damaged, every commit entry above the fallback: for the error path."""
    found = checkpoint_files(storage)
    damaged: list[tuple[str, str]] = []
    bad_versions: set[int] = set()
    for version, names in sorted(found.items()):
        detail = checkpoint_problem(storage, names)
        if detail is not None:
            bad_versions.add(version)
            damaged += [(f"{LOG_DIR}/{n}", f"(checkpoint of version {version}) {detail}") for n in sorted(names)]
    # a hint that is not JSON is no damage: delta-rs then lists the log (it loads); a hint naming
    # a checkpoint that is missing or damaged is (delta-rs: "Had a _last_checkpoint hint but
    # didn't find any checkpoints")
    hinted = _hinted_version(storage)
    if hinted is not None and hinted not in found:
        damaged.append((CHECKPOINT_HINT, f"names checkpoint version {hinted}, which is missing"))
    elif hinted is not None and hinted in bad_versions:
        damaged.append((CHECKPOINT_HINT, f"names the damaged checkpoint of version {hinted}"))
    if not damaged:
        return None
    commits = [int(n[:20]) for n in storage.log_entries() if n.endswith(".json") and n[:20].isdigit()]
    newest = max([*commits, *found], default=-1)
    blocker: tuple[str, str] | None = None
    for start in [*sorted((v for v in found if v not in bad_versions), reverse=True), -1]:
        first_bad = next(((v, d) for v in range(start + 1, newest + 1)
                          if (d := _structure_problem(storage.read(commit_path(v)))) is not None), None)
        if first_bad is None:
            return CheckpointDamage(tuple(damaged), start)
        if blocker is None:
            blocker = (commit_path(first_bad[0]), first_bad[1])
    return CheckpointDamage(tuple(damaged), None, blocker)


def fall_back_from_damaged_checkpoint(storage: TableStorage, *, what: str) -> CheckpointDamage | None:
    """Make a table whose checkpoint is torn or missing load again, when that is provably safe.

    A checkpoint only summarizes the commit entries before it, so the table's state is the same
    when it is loaded from an older readable checkpoint (or from version 0) plus every commit
    entry after it. When every such entry exists and parses, the damaged checkpoint files are
    moved aside (renamed ``_damaged.{name}`` in the log folder, kept for inspection) and a
    ``_last_checkpoint`` naming no readable checkpoint is removed (it is a hint: delta-rs lists
    the log without it). Returns what was done, None when nothing was damaged. When some entry
    after every readable checkpoint is missing or unreadable, nothing is changed and
    :class:`LogIntegrityError` names the damaged checkpoint, the missing entry and what to do.
    Safe against a concurrent caller doing the same (a file already moved is fine).
    """
    damage = find_checkpoint_damage(storage)
    if damage is None:
        return None
    if damage.fallback is None:
        first = damage.damaged[0][0]
        blocker = (f"; and commit {storage.location(damage.blocker[0])} {damage.blocker[1]}, so no "
                   "older checkpoint or the commits alone can replace it" if damage.blocker else "")
        raise LogIntegrityError(
            f"{what}: the Delta log at {storage.uri} cannot be loaded: {damage.describe(storage)}"
            f"{blocker}. Restore {storage.location(first)} (or the missing commit) from a backup "
            "before using the table again", table=what, path=storage.location(first),
            damaged=[storage.location(r) for r, _ in damage.damaged])
    for rel, _ in damage.damaged:
        if rel == CHECKPOINT_HINT:
            storage.delete([rel])
        else:
            storage.move(rel, f"{LOG_DIR}/{DAMAGED_PREFIX}{rel.rsplit('/', 1)[-1]}")
    logging.getLogger(__name__).warning(
        "%s: %s; moved aside, the table loads from %s (every later commit entry is present)",
        what, damage.describe(storage),
        "version 0" if damage.fallback < 0 else f"the checkpoint of version {damage.fallback}")
    return damage


def open_delta_table(
    uri: str, storage_options: Mapping[str, str] | None, *, what: str, version: int | None = None
) -> DeltaTable:
    """``DeltaTable(uri)``, falling back from a torn or missing checkpoint when that is safe
    (:func:`fall_back_from_damaged_checkpoint`). Any other load error is raised as it is (the
    caller turns it into a typed error, :func:`diagnose_unloadable`)."""
    from deltalake.exceptions import DeltaError, TableNotFoundError

    options = dict(storage_options) if storage_options else None
    try:
        return DeltaTable(uri, version=version, storage_options=options)
    except TableNotFoundError:
        raise
    except DeltaError:
        if fall_back_from_damaged_checkpoint(TableStorage(uri, options), what=what) is None:
            raise
    return DeltaTable(uri, version=version, storage_options=options)


def diagnose_unloadable(
    storage: TableStorage, *, what: str, error: Exception, queue_rules: bool = True
) -> Exception:
    """The error to raise when delta-rs cannot load a table's log: a :class:`LogIntegrityError`
    naming the damaged checkpoint or commit entry when one is found, else ``error``.

    ``queue_rules``: False for system tables (positions, coordinator), whose healthy commits carry
    no ``cues.ranges`` and must not be blamed (:func:`check_commit`)."""
    said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    damage = find_checkpoint_damage(storage)
    if damage is not None:
        first = damage.damaged[0][0]
        todo = ("open it again: it loads from the previous checkpoint, every commit after it is "
                "present" if damage.fallback is not None else
                f"restore {storage.location(first)} (or commit "
                f"{storage.location(damage.blocker[0]) if damage.blocker else '?'}) from a backup "
                "before using the table again")
        return LogIntegrityError(
            f"{what}: the Delta log at {storage.uri} cannot be loaded: {damage.describe(storage)}; "
            f"{todo}. delta-rs said: {said}", table=what, path=storage.location(first))
    entries = [int(n[:-5]) for n in storage.log_entries() if n.endswith(".json") and n[:-5].isdigit()]
    if not entries:
        return error
    newest = max(entries)
    start = newest_checkpoint(storage, newest)
    versions = range(max(0 if start is None else start + 1, newest - 200), newest + 1)
    problems = check_commits(what, storage, versions, files=False, queue_rules=queue_rules)
    if not problems:
        return error
    first = problems[0]
    return LogIntegrityError(
        f"{what}: the Delta log at {storage.uri} cannot be read: {first.detail.split(';')[0]} "
        f"({storage.location(first.path or '')}); restore that file from a backup before using "
        f"the table again. delta-rs said: {said}",
        table=what, path=storage.location(first.path or ""), version=first.version,
        problems=problems)


# -- (a): statistics ---------------------------------------------------------------------------------
def _statistics(queue: str, dt: DeltaTable, partitions: Iterable[str]) -> list[Inconsistency]:
    adds = dt.get_add_actions(flatten=True)
    names = set(adds.column_names)
    part_col, max_col = f"partition.{PARTITION}", f"max.{OFFSET}"
    files: dict[str, tuple[int, int | None]] = {}  # partition -> (rows, max offset)
    if adds.num_rows and part_col in names:
        parts = adds[part_col].to_pylist()
        rows = adds["num_records"].to_pylist()
        maxes = adds[max_col].to_pylist() if max_col in names else [None] * len(parts)
        bases = file_bases(pa.table(adds)).to_pylist()  # based offsets (based.py)
        maxes = [m if m is None else m + b for m, b in zip(maxes, bases, strict=True)]
        for p, n, m in zip(parts, rows, maxes, strict=True):
            count, top = files.get(p, (0, None))
            files[p] = (count + int(n or 0), top if m is None else max(m, top if top is not None else m))
    problems: list[Inconsistency] = []
    declared = {p: int(v) for p in partitions
                if (v := dt.transaction_version(PARTITION_ID.id(p))) is not None}
    for p in sorted(set(declared) | set(files)):
        count, top = files.get(p, (0, None))
        # rows below the start offset were removed by retention (retention.py), on purpose
        start = int(dt.transaction_version(START.id(p)) or 0)
        kept = "" if not start else f" from its start offset {start}"
        if p not in declared:
            # no part: transaction (a queue written without one): offsets come from the
            # statistics, which must then be dense from the start offset
            if top is not None and top + 1 - start != count:
                problems.append(Inconsistency(
                    queue, p, "offsets",
                    f"the files hold {count} row(s) but offsets up to {top}{kept}: rows are "
                    f"missing; {REPAIR_HINT}"))
            continue
        nxt = declared[p]
        if count != nxt - start:
            problems.append(Inconsistency(
                queue, p, "rows",
                f"the log says the next offset is {nxt}{kept} but the files hold {count} row(s) "
                f"instead of {nxt - start}: a commit or data file is missing or damaged, or rows "
                f"were deleted outside retention; {REPAIR_HINT}"))
        elif top is not None and top + 1 != nxt:
            problems.append(Inconsistency(
                queue, p, "offsets",
                f"the log says the next offset is {nxt} but the highest stored offset is {top}; "
                f"{REPAIR_HINT}"))
    return problems


def find_inconsistencies(queue: str, dt: DeltaTable, partitions: Iterable[str]) -> list[Inconsistency]:
    """Every disagreement of the snapshot ``dt``'s log with itself and its files (the full check).

    (a) each declared partition's ``part:`` transaction vs its files' rows and offsets (add-action
    statistics, not the data); (b) every commit entry since the newest checkpoint (empty,
    truncated, no commitInfo, declared rows vs add actions); (c) every data file the snapshot
    references exists. Reads the commit entries and stats every file: for audits, not per append.
    """
    storage = TableStorage.of(dt)
    problems = _statistics(queue, dt, partitions)
    top = dt.version()
    start = newest_checkpoint(storage, top)
    problems += check_commits(queue, storage, range(0 if start is None else start + 1, top + 1),
                              files=False)
    # a damaged entry beyond the snapshot (the newest commit, emptied or truncated) is in no
    # snapshot: look at the next version too
    ahead = storage.read(commit_path(top + 1))
    if ahead is not None:
        problems += check_commit(queue, top + 1, ahead)
    referenced = [str(p) for p in dt.get_add_actions(flatten=True)["path"].to_pylist()]
    problems += [Inconsistency(
        queue, None, "missing-file",
        f"data file {storage.location(rel)} is referenced by the log but missing; {REPAIR_HINT}",
        path=rel) for rel in storage.missing(referenced)]
    return problems


__all__ = [
    "Inconsistency",
    "TableStorage",
    "check_commit",
    "check_commits",
    "diagnose_unloadable",
    "fall_back_from_damaged_checkpoint",
    "find_checkpoint_damage",
    "open_delta_table",
    "find_inconsistencies",
    "leftover_content",
]
