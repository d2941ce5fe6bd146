"""Finding what processors left in a lake: the folders under a lake URI and the backing queues
(``_cues/backing/{processor}``, one per exactly-once processor lane that ran).

Processing needs this to know every processor of a lake (a lake written before the deployments
registry: ``deployments.py``, ``retention.py``); the auditor reads it from here
(``audit/discovery.py``).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable
from pyarrow import fs

from cues_platform.processing.errors import LakeListingError
from cues_platform.queues import Lake
from cues_platform.queues.faults import unreachable
from cues_platform.queues.filesystems import filesystem_for


def list_dirs(uri: str, lake: Lake) -> list[str]:
    """Names of the folders directly under ``uri`` (none when it does not exist). Raises
    :class:`LakeListingError` when the folder cannot be listed, or the store's
    ``StorageUnreachableError`` when the store cannot be reached."""
    if lake.is_local:
        folder = Path(lake.local_path(uri))
        try:
            return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        except OSError as exc:
            raise LakeListingError(f"cannot list {folder}: {exc}; check its permissions",
                                   uri=uri) from exc
    try:
        filesystem, path = filesystem_for(uri, lake.options)
        infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
    except (OSError, pa.ArrowException) as exc:
        unreachable_store = unreachable(exc, table=f"lake {lake.root}", uri=uri, during="list")
        if unreachable_store is not None:
            raise unreachable_store from exc
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise LakeListingError(f"cannot list {uri}: {reason}", uri=uri) from exc
    return sorted(i.base_name for i in infos if i.type == fs.FileType.Directory)


def backing_uri(lake: Lake, processor: str) -> str:
    return lake.system_uri("backing", processor)


def backing_folders(lake: Lake) -> list[str]:
    """Every folder under ``_cues/backing/``, one per exactly-once processor that ran."""
    return list_dirs(lake.system_uri("backing"), lake)


def backing_processors(lake: Lake) -> list[str]:
    """Ids of the processors that have a backing queue (a Delta table) under the lake."""
    return [name for name in backing_folders(lake)
            if DeltaTable.is_deltatable(backing_uri(lake, name), storage_options=lake.options)]
