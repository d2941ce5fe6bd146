"""Paths named by the lake's own records stay inside the lake (a traversal check).

Recovery, staging and commits read and write files that a record of the lake names: an attempt
record's staged files, a staging folder built from a snapshot's processor id. A record is data,
and data can be damaged or forged; before this check, an attempt record naming
``/tmp/evil.parquet`` made recovery append that file's rows to an output queue. :func:`confine`
is called on every such path before it is opened, written or deleted, and refuses anything that
is not inside the lake's root (and, when given, inside one area of it, such as the staging area):

- a local lake (a folder or ``file://`` URI): the path must be absolute, have no ``.``/``..``
  segment, and its real path (symlinks resolved, for the part of it that exists) must lie below
  the lake root's real path; so a symlink inside the lake that points out of it is outside;
- an object store (``s3://bucket/prefix``...): the same scheme and bucket as the lake's root, no
  ``.``/``..`` segment in the key, and the key below the root's prefix (segments compared, so
  ``lake-2/`` is not below ``lake``).

What the check cannot tell: a file inside the lake that a forged record names. That is for the
auditor's other checks (a staged file must belong to its step: :func:`confine` with ``under``).
"""

from __future__ import annotations

import os
from typing import Any

from cues_platform.queues.errors import QueueError
from cues_platform.queues.filesystems import is_local_uri


class PathOutsideLakeError(QueueError):
    """A record or a caller named a file outside the lake (or outside the area of it where such
    files live). Carries ``path`` (as named), ``root`` (the lake root), ``area`` (the folder it
    must be under), ``named_by`` (the record that named it, in words) and ``reason``. Nothing was
    read or written. Not retryable: the record is damaged or forged; the lake must be inspected
    (``cues audit``) before the processor runs again."""

    retryable = False


def confine(*, root: str, path: str, under: str | None = None, named_by: str = "",
            **data: Any) -> str:
    """Return ``path`` unchanged if it lies inside the lake ``root`` (and inside ``under``, a
    folder of the lake, when given), else raise :class:`PathOutsideLakeError` naming the file,
    the lake, the record that named it (``named_by``, in words) and what to do. ``data`` (queue,
    processor, step...) is carried by the error."""
    area = under if under is not None else root
    reason = _outside(root, area, path)
    if reason is None:
        return path
    by = f" named by {named_by}" if named_by else ""
    where = f"the lake {root}" if area == root else f"{area} of the lake {root}"
    raise PathOutsideLakeError(
        f"refusing file {path!r}{by}: it is not inside {where} ({reason}); nothing was read or "
        "written. A record of the lake that names a file elsewhere is damaged or forged: run "
        "`cues audit` on the lake and restore the record's table before running its processor "
        "again",
        path=path, root=root, area=area, named_by=named_by, reason=reason, **data,
    )


def is_inside(*, root: str, path: str, under: str | None = None) -> bool:
    """True when :func:`confine` accepts ``path``."""
    return _outside(root, under if under is not None else root, path) is None


def _outside(root: str, area: str, path: str) -> str | None:
    """Why ``path`` is not inside ``area`` (itself inside ``root``), or None when it is."""
    if not isinstance(path, str) or not path:
        return "it is not a path"
    if is_local_uri(root) != is_local_uri(path):
        return "a local lake names a file on an object store" if is_local_uri(root) else (
            "a lake on an object store names a local file")
    if is_local_uri(root):
        return _outside_local(root, area, path)
    return _outside_remote(root, area, path)


def _segments(text: str) -> list[str]:
    return [s for s in text.split("/") if s]


def _outside_local(root: str, area: str, path: str) -> str | None:
    raw = path.removeprefix("file://")
    if "\x00" in raw:
        return "it holds a NUL character"
    if not os.path.isabs(raw):
        return "it is not an absolute path"
    if any(s in (".", "..") for s in raw.split("/")):
        return "it has a '.' or '..' segment"
    base = os.path.realpath(area.removeprefix("file://"))
    top = os.path.realpath(root.removeprefix("file://"))
    real = os.path.realpath(raw)  # symlinks resolved where the path exists
    if not _below(base, top) and base != top:
        return f"the area {area} itself is outside the lake"
    if not _below(real, base):
        if real != os.path.normpath(raw):
            return f"it resolves to {real}"
        return "it is outside that folder"
    return None


def _below(path: str, folder: str) -> bool:
    """``path`` is strictly below ``folder`` (both normalized absolute paths)."""
    return path != folder and os.path.commonpath([path, folder]) == folder


def _split_remote(uri: str) -> tuple[str, str, list[str]]:
    scheme, _, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    return scheme.lower(), bucket, key.split("/") if key else []


def _outside_remote(root: str, area: str, path: str) -> str | None:
    scheme, bucket, key = _split_remote(path)
    if any(s in (".", "..") for s in key):
        return "it has a '.' or '..' segment"
    r_scheme, r_bucket, r_key = _split_remote(root)
    if (scheme, bucket) != (r_scheme, r_bucket):
        return f"it is in {scheme}://{bucket}, the lake in {r_scheme}://{r_bucket}"
    a_scheme, a_bucket, a_key = _split_remote(area)
    if (a_scheme, a_bucket) != (r_scheme, r_bucket) or not _prefix(_segments("/".join(r_key)),
                                                                    _segments("/".join(a_key))):
        return f"the area {area} itself is outside the lake"
    mine, folder = _segments("/".join(key)), _segments("/".join(a_key))
    if len(mine) <= len(folder) or not _prefix(folder, mine):
        return "it is outside that folder"
    return None


def _prefix(head: list[str], whole: list[str]) -> bool:
    return whole[: len(head)] == head


__all__ = ["PathOutsideLakeError", "confine", "is_inside"]
