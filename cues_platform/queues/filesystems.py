"""A pyarrow file system for any lake path: local folders directly, object stores through delta-rs.

Everything the platform reads or writes outside delta-rs' own table calls (listing queue folders,
staged step outputs, Parquet footers, the auditor's checks of commit files) goes through
:func:`filesystem_for`, so one set of settings, the lake's delta-rs ``storage_options`` (or the
same ``AWS_*`` / ``AZURE_*`` / ``GOOGLE_*`` environment variables delta-rs reads), reaches every
access. ``pyarrow.fs.FileSystem.from_uri`` is not used for remote lakes: it ignores those
options (an S3-compatible endpoint, ``AWS_ALLOW_HTTP``) and resolved a moto bucket as
``bucket.s3.us-east-1.amazonaws.com``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from pyarrow import fs


def is_local_uri(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def filesystem_for(
    uri: str, storage_options: Mapping[str, str] | None = None
) -> tuple[fs.FileSystem, str]:
    """The file system and the path on it of ``uri``: a local path (or ``file://`` URI) is
    pyarrow's local file system and the path unchanged; a remote URI (``s3://bucket/key``) is
    delta-rs' object store for ``scheme://bucket`` with ``storage_options`` and the key."""
    if is_local_uri(uri):
        return fs.LocalFileSystem(), uri.removeprefix("file://")
    scheme, _, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    options = tuple(sorted((storage_options or {}).items()))
    return _object_store(f"{scheme}://{bucket}", options), key.rstrip("/")


@lru_cache(maxsize=32)
def _object_store(root: str, options: tuple[tuple[str, str], ...]) -> fs.FileSystem:
    from deltalake.fs import DeltaStorageHandler

    return fs.PyFileSystem(DeltaStorageHandler(root, dict(options)))


def join_path(root: str, *parts: str) -> str:
    """``root/part/...`` on a file system path (empty ``root``: the bucket's top)."""
    return "/".join(p for p in (root.rstrip("/"), *parts) if p)


__all__ = ["filesystem_for", "is_local_uri", "join_path"]
