"""Finding what to audit: the lake itself, its queue folders and its backing queues.

Listing folders and finding backing queues is processing's (``processing/discovery.py``, which the
runner and retention need too); here a failed listing is an :class:`AuditError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from cues_platform.audit.errors import AuditError, LakeNotFoundError
from cues_platform.processing import discovery as listing
from cues_platform.processing.discovery import backing_uri
from cues_platform.processing.errors import LakeListingError
from cues_platform.queues import Lake, Queue
from cues_platform.queues.names import join_uri

__all__ = ["backing_folders", "backing_processors", "backing_uri", "check_lake", "list_dirs",
           "open_backing", "queue_folders"]


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


@contextmanager
def _as_audit_error() -> Iterator[None]:
    """A listing that failed is an :class:`AuditError` to the auditor's callers (same message,
    data and cause as when the auditor listed folders itself)."""
    try:
        yield
    except LakeListingError as exc:
        raise AuditError(exc.message, **exc.data) from exc.__cause__


def list_dirs(uri: str, lake: Lake) -> list[str]:
    """Names of the folders directly under ``uri`` (none when it does not exist)."""
    with _as_audit_error():
        return listing.list_dirs(uri, lake)


def queue_folders(lake: Lake) -> list[str]:
    """Every folder under ``queues/``: the queues, and folders that should be one (a lost log)."""
    return list_dirs(join_uri(lake.root, "queues"), lake)


def backing_folders(lake: Lake) -> list[str]:
    """Every folder under ``_cues/backing/``, one per exactly-once processor that ran."""
    with _as_audit_error():
        return listing.backing_folders(lake)


def backing_processors(lake: Lake) -> list[str]:
    """Ids of the processors that have a backing queue (a Delta table) under the lake."""
    with _as_audit_error():
        return listing.backing_processors(lake)


def open_backing(lake: Lake, processor: str) -> Queue:
    # Opened read-only (BackingQueue(...) would create a missing table).
    return lake.queue(processor, uri=backing_uri(lake, processor))
