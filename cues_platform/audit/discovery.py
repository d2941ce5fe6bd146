"""Finding what to audit: the lake itself, its queue folders and its backing queues."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from cues_platform.audit.errors import AuditError, LakeNotFoundError
from cues_platform.queues import Lake, Queue
from cues_platform.queues.faults import unreachable
from cues_platform.queues.filesystems import filesystem_for
from cues_platform.queues.names import join_uri


def check_lake(lake: Lake) -> None:
    """Raise :class:`LakeNotFoundError` unless ``lake`` exists and looks like a cues lake."""
    if lake.is_local:
        root = lake.local_path(lake.root)
        if not root.exists():
            raise LakeNotFoundError(
                f"no lake at {root}: the folder does not exist (pass --lake with the lake root)",
                root=str(root),
            )
        if not root.is_dir():
            raise LakeNotFoundError(
                f"no lake at {root}: it is a file, not a folder", root=str(root)
            )
        if not (root / "queues").is_dir() and not (root / "_cues").is_dir():
            raise LakeNotFoundError(
                f"{root} is not a cues lake: it has neither a queues/ nor a _cues/ folder",
                root=str(root),
            )
        return
    if not list_dirs(join_uri(lake.root, "queues"), lake) and not list_dirs(
        lake.system_uri(), lake
    ):
        raise LakeNotFoundError(
            f"no lake at {lake.root}: nothing under queues/ or _cues/", root=lake.root
        )


def list_dirs(uri: str, lake: Lake) -> list[str]:
    """Names of the folders directly under ``uri`` (none when it does not exist)."""
    if lake.is_local:
        folder = Path(lake.local_path(uri))
        try:
            return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        except OSError as exc:
            raise AuditError(f"cannot list {folder}: {exc}; check its permissions", uri=uri) from exc
    from pyarrow import fs

    try:
        filesystem, path = filesystem_for(uri, lake.options)
        infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
    except (OSError, pa.ArrowException) as exc:
        unreachable_store = unreachable(exc, table=f"lake {lake.root}", uri=uri, during="list")
        if unreachable_store is not None:
            raise unreachable_store from exc
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise AuditError(f"cannot list {uri}: {reason}", uri=uri) from exc
    return sorted(i.base_name for i in infos if i.type == fs.FileType.Directory)


def queue_folders(lake: Lake) -> list[str]:
    """Every folder under ``queues/``: the queues, and folders that should be one (a lost log)."""
    return list_dirs(join_uri(lake.root, "queues"), lake)


def backing_folders(lake: Lake) -> list[str]:
    """Every folder under ``_cues/backing/``, one per exactly-once processor that ran."""
    return list_dirs(lake.system_uri("backing"), lake)


def backing_processors(lake: Lake) -> list[str]:
    """Ids of the processors that have a backing queue (a Delta table) under the lake."""
    from deltalake import DeltaTable

    return [
        name
        for name in backing_folders(lake)
        if DeltaTable.is_deltatable(lake.system_uri("backing", name), storage_options=lake.options)
    ]


def backing_uri(lake: Lake, processor: str) -> str:
    return lake.system_uri("backing", processor)


def open_backing(lake: Lake, processor: str) -> Queue:
    # Opened read-only (BackingQueue(...) would create a missing table).
    return lake.queue(processor, uri=backing_uri(lake, processor))
