"""The lake's location: a root (local folder or any delta-rs URI) under which queues and system
tables live; where each table is, how one is created, opened and diagnosed.

Floor 2 of ``queues/`` (docs/architecture.md), beside the queue handle (``handle.py``): it knows
the layout below it and no handle. The user's :class:`~cues_platform.queues.lake.Lake` is this
location with ``queue``/``create_queue`` returning :class:`~cues_platform.queues.queue.Queue`.

Layout::

    {root}/queues/{name}/          one Delta table per queue
    {root}/_cues/positions/        durable tailer positions (one small Delta table)
    {root}/_cues/transactions/     the transaction coordinator's log
    {root}/_cues/backing/{proc}/   processors' backing queues (processing layer)
    {root}/_cues/staging/          prepared, not yet committed outputs (processing layer)
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError
from pyarrow import fs

from cues_platform.errors import ConfigurationError
from cues_platform.queues.creation import create_table_once
from cues_platform.queues.errors import (
    InvalidNameError,
    MissingLogError,
    QueueNotFoundError,
)
from cues_platform.queues.faults import translated
from cues_platform.queues.filesystems import filesystem_for
from cues_platform.queues.integrity import (
    TableStorage,
    diagnose_unloadable,
    leftover_content,
    open_delta_table,
)
from cues_platform.queues.layout import (
    FORMAT_KEY,
    MAX_ROWS_KEY,
    NO_LOG_CLEANUP_PROPERTY,
    PARTITIONS_KEY,
    QUEUE_CHECKPOINT_INTERVAL,
    QUEUE_TOMBSTONE_PROPERTY,
    STATS_COLUMNS,
    OffsetLayout,
)
from cues_platform.queues.names import join_uri, validate_name, validate_partition
from cues_platform.queues.schema import (
    BASE,
    PARTITION,
    full_schema,
    validate_payload_schema,
)

DEFAULT_MAX_BATCH_ROWS = 5_000_000
_REMOTE_SCHEMES = ("s3://", "s3a://", "abfss://", "abfs://", "az://", "gs://", "gcs://", "file://")


def _normalize_root(root: str | os.PathLike[str]) -> str:
    text = os.fspath(root)
    if not text:
        raise ConfigurationError(
            "the lake root is empty: pass a folder or a URI such as s3://bucket/lake"
        )
    if "://" in text:
        if not text.startswith(_REMOTE_SCHEMES):
            raise ConfigurationError(
                f"unsupported lake URI {text!r}: use a local folder or one of {', '.join(_REMOTE_SCHEMES)}"
            )
        return text.rstrip("/")
    return str(Path(text).expanduser().resolve())


@dataclass(frozen=True)
class QueueTable:
    """A queue's table as :meth:`LakeLocation.create_queue_table` found or made it."""

    uri: str
    payload: pa.Schema
    partitions: list[str]
    created: bool


@dataclass(frozen=True)
class LakeLocation:
    """Where queues live. ``storage_options`` go to delta-rs unchanged (credentials come from the
    environment or these options; they are never logged)."""

    root: str
    storage_options: Mapping[str, str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", _normalize_root(self.root))

    @property
    def is_local(self) -> bool:
        return "://" not in self.root or self.root.startswith("file://")

    @property
    def options(self) -> dict[str, str] | None:
        return dict(self.storage_options) if self.storage_options else None

    def queue_uri(self, name: str) -> str:
        return join_uri(self.root, "queues", validate_name(name))

    def system_uri(self, *parts: str) -> str:
        return join_uri(self.root, "_cues", *parts)

    def local_path(self, uri: str) -> Path:
        """The filesystem path of a local URI (for staging files and listings)."""
        if not self.is_local:
            raise ConfigurationError(f"{uri!r} is not on the local filesystem")
        return Path(uri.removeprefix("file://"))

    # -- queues ---------------------------------------------------------------------------------
    def create_queue_table(
        self,
        name: str,
        *,
        schema: pa.Schema,
        partitions: Sequence[str] = ("0",),
        max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
        description: str = "",
        uri: str | None = None,
        properties: Mapping[str, str] | None = None,
        offset_layout: OffsetLayout = OffsetLayout.ABSOLUTE,
    ) -> QueueTable:
        """Create a queue's table (an empty Delta table) unless one is at its place already.

        Returns where it is and whether this call created it; an existing table is the caller's
        to check (``Lake.create_queue`` reuses it only with ``exist_ok`` and the same payload
        schema). ``properties`` are extra Delta table properties set at creation (``delta.*``
        only). ``offset_layout``: how the data files hold offsets (:class:`OffsetLayout`).
        """
        uri = uri or self.queue_uri(name)
        if not isinstance(offset_layout, OffsetLayout):
            raise ConfigurationError(
                f"queue {name!r}: offset_layout must be an OffsetLayout (absolute or based), got "
                f"{offset_layout!r}", queue=name)
        based = offset_layout is OffsetLayout.BASED
        payload = validate_payload_schema(schema, queue=name)
        parts = partition_names(partitions, where=f"create_queue({name!r})")
        if not parts or len(set(parts)) != len(parts):
            raise ConfigurationError(
                f"queue {name!r}: declare one or more distinct partitions, got {list(partitions)}"
            )
        if max_batch_rows < 1:
            raise ConfigurationError(f"queue {name!r}: max_batch_rows must be >= 1")
        if DeltaTable.is_deltatable(uri, storage_options=self.options):
            return QueueTable(uri=uri, payload=payload, partitions=parts, created=False)
        self.refuse_lost_log(uri, what=f"queue {name!r}")
        created_folder = self.is_local and not self.local_path(uri).exists()
        try:
            created = create_table_once(
                self,
                uri,
                full_schema(payload, based=based),
                what=f"queue {name!r}",
                partition_by=[PARTITION, BASE] if based else [PARTITION],
                name=name,
                description=description or None,
                configuration={
                    PARTITIONS_KEY: json.dumps(parts),
                    MAX_ROWS_KEY: str(max_batch_rows),
                    FORMAT_KEY: offset_layout.format_version,
                    "delta.checkpointInterval": str(QUEUE_CHECKPOINT_INTERVAL),
                    **NO_LOG_CLEANUP_PROPERTY,  # log cleanup is maintenance's (see COMMIT_HOOKS)
                    # tombstones kept exactly as long as vacuum's retention (maintenance.py)
                    **QUEUE_TOMBSTONE_PROPERTY,
                    # File statistics only where the queue layer prunes by them: computing min/max
                    # of every payload column took a third of a small append's commit.
                    "delta.dataSkippingStatsColumns": STATS_COLUMNS,
                    **_delta_properties(name, properties),
                },
                raise_if_key_not_exists=False,
            )
        except DeltaError as exc:
            if created_folder:
                self._remove_empty_folder(uri)
            raise ConfigurationError(
                f"queue {name!r} could not be created at {uri}: {str(exc).splitlines()[0]}; "
                "fix the queue's definition (its properties) and create it again",
                queue=name, uri=uri) from exc
        # another creator may have won the race: then its queue, under the same checks
        return QueueTable(uri=uri, payload=payload, partitions=parts, created=created)

    def has_queue(self, name: str) -> bool:
        return DeltaTable.is_deltatable(self.queue_uri(name), storage_options=self.options)

    def refuse_lost_log(self, uri: str, *, what: str) -> None:
        """Raise :class:`MissingLogError` when ``uri`` holds no Delta table but holds files.

        Such a folder is a table whose ``_delta_log`` was lost (or something that is not ours):
        creating a new, empty table there would restart its offsets at 0 and let vacuum delete
        the old data files. A commit being written by a concurrent creator is not content.
        """
        content = leftover_content(uri, self.options)
        if content and not DeltaTable.is_deltatable(uri, storage_options=self.options):
            shown = ", ".join(content[:3]) + (f" and {len(content) - 3} more" if len(content) > 3 else "")
            raise MissingLogError(
                f"{what}: {uri} holds {len(content)} file(s) ({shown}) but no Delta log "
                f"({uri}/_delta_log is missing or empty); refusing to create a new, empty table over "
                "them. Restore the _delta_log folder from a backup, or move the folder away if its "
                "data is not needed",
                table=what, path=uri, files=len(content))

    def _remove_empty_folder(self, uri: str) -> None:
        """Remove a folder a failed create left behind, only while it holds no file."""
        path = self.local_path(uri)
        if path.is_dir() and not any(p.is_file() for p in path.rglob("*")):
            shutil.rmtree(path, ignore_errors=True)

    def list_queues(self) -> list[str]:
        """Names of the queues under this lake (local lakes list the folder; remote ones list
        through delta-rs' object store with the lake's storage options)."""
        base = join_uri(self.root, "queues")
        if self.is_local:
            folder = self.local_path(base)
            names = [p.name for p in folder.iterdir() if p.is_dir()] if folder.exists() else []
        else:
            filesystem, path = filesystem_for(base, self.options)
            with translated(table=f"lake {self.root}", uri=base, during="list"):
                infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
            names = [i.base_name for i in infos if i.type == fs.FileType.Directory]
        return sorted(n for n in names if _is_queue_name(n) and self.has_queue(n))

    def open_table(self, uri: str, *, what: str, version: int | None = None) -> DeltaTable:
        """Open a Delta table; a lost or damaged log is a typed error naming the file.

        A torn or missing checkpoint falls back to the previous checkpoint (or the commits) when
        every later commit entry is present (the damaged file is moved aside,
        :func:`~cues_platform.queues.integrity.open_delta_table`). Raises
        :class:`QueueNotFoundError` (nothing there), :class:`MissingLogError` (files but no log)
        or :class:`LogIntegrityError` (a checkpoint or commit entry that cannot be read and cannot
        be done without)."""
        try:
            with translated(table=what, uri=uri, during="open"):
                return open_delta_table(uri, self.options, what=what, version=version)
        except TableNotFoundError as exc:
            self.refuse_lost_log(uri, what=what)
            raise QueueNotFoundError(
                f"{what} does not exist at {uri}; create it first (Lake.create_queue)", uri=uri
            ) from exc
        except DeltaError as exc:
            raise self.diagnose_log(uri, what=what, error=exc) from exc

    def diagnose_log(self, uri: str, *, what: str, error: Exception) -> Exception:
        """The error to raise when delta-rs cannot load a table's log: a
        :class:`LogIntegrityError` naming the damaged checkpoint or commit entry and what to do
        when one is found, else ``error`` (:func:`~cues_platform.queues.integrity.diagnose_unloadable`)."""
        return diagnose_unloadable(TableStorage(uri, self.options), what=what, error=error)



def partition_names(partitions: object, *, where: str, argument: str = "partitions") -> list[str]:
    """The partition names of ``partitions`` (a sequence of names), each validated.

    A ``str`` or ``bytes`` is refused: iterating it would declare one partition per character
    (``"ab"`` -> ``"a"``, ``"b"``), silently. Raises :class:`ConfigurationError` naming
    ``argument`` and the fix, or :class:`InvalidNameError` for an illegal name."""
    if isinstance(partitions, str | bytes | bytearray):
        shown = partitions.decode(errors="replace") if isinstance(partitions, bytes | bytearray) \
            else partitions
        raise ConfigurationError(
            f"{where}: {argument} must be a sequence of partition names such as ['a', 'b'], not "
            f"the {type(partitions).__name__} {partitions!r} (it would declare one partition per "
            f"character); pass [{shown!r}] for the one partition {shown!r}",
            argument=argument, value=partitions)
    if not isinstance(partitions, Iterable):
        raise ConfigurationError(
            f"{where}: {argument} must be a sequence of partition names such as ['a', 'b'], not "
            f"{type(partitions).__name__} {partitions!r}", argument=argument, value=partitions)
    return [validate_partition(p) for p in partitions]


def _is_queue_name(name: str) -> bool:
    """Folders whose name is no legal queue name are not queues (never made by us)."""
    try:
        validate_name(name)
    except InvalidNameError:
        return False
    return True


def _delta_properties(name: str, properties: Mapping[str, str] | None) -> dict[str, str]:
    props = dict(properties or {})
    bad = sorted(k for k in props if not k.startswith("delta."))
    if bad:
        raise ConfigurationError(
            f"queue {name!r}: only delta.* table properties may be set, not {bad}; the cues.* "
            "properties belong to the queue layer", queue=name)
    return {k: str(v) for k, v in props.items()}


def reset_local_lake(root: str | os.PathLike[str]) -> None:
    """Delete a local lake folder so a demo starts fresh — but only a lake: a missing or empty
    folder is fine, a folder holding ``queues/`` or ``_cues/`` is deleted, anything else is
    refused (so ``--lake ~`` can never wipe a home folder)."""
    path = Path(str(root).removeprefix("file://")).expanduser()
    if "://" in str(root) and not str(root).startswith("file://"):
        raise ConfigurationError(f"{root!r}: only a local lake folder can be reset", root=str(root))
    if not path.exists():
        return
    if not path.is_dir():
        raise ConfigurationError(f"{path} is a file, not a lake folder; pick another --lake", root=str(path))
    entries = sorted(p.name for p in path.iterdir())
    if entries and not {"queues", "_cues"} & set(entries):
        shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
        raise ConfigurationError(
            f"refusing to delete {path}: it is not a cues lake (it holds {shown}); pass a new or "
            "empty folder, or a lake made by an earlier demo", root=str(path))
    shutil.rmtree(path)
