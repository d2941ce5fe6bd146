"""Storage faults as one typed line naming the cause and what to do.

delta-rs (object_store) retries a request that gets no answer, then raises an ``OSError`` or a
``DeltaError`` whose message is a multi-line chain with terminal colours ("Generic S3 error ↳
Error performing GET http://… ↳ error sending request ↳ tcp connect error ↳ Connection refused",
"Generic LocalFileSystem error ↳ Unable to copy data to file ↳ No space left on device (os error
28)", "Failed to parse parquet: … Read-only file system (os error 30)"). :func:`storage_fault`
recognizes the cause and turns it into one line naming the table, what was being done, the
cause and what to do:

* the store did not answer → :class:`StorageUnreachableError`;
* no room (ENOSPC, EDQUOT, EFBIG) → :class:`StorageFullError`;
* a read-only file system or a refused permission → :class:`StorageNotWritableError`;
* any other storage error of a commit → :class:`CommitOutcomeUnknownError` (a lost
  acknowledgement: the commit may have landed).

A failed commit may have landed, so every message that follows a commit says, for the path that
failed (``during``), how to go on *without writing anything twice*: a plain append has no
sequence, so it is never to be resent blindly; a producer's resend of the same batch and sequence
is a no-op when the first landed; a transaction's ``commit()`` again reads the coordinator.
Any other error is left alone (None).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from deltalake.exceptions import DeltaError

from cues_platform.queues.errors import (
    CommitOutcomeUnknownError,
    QueueError,
    StorageFullError,
    StorageNotWritableError,
    StorageUnreachableError,
)

_MARKERS = (
    "error sending request", "tcp connect error", "connection refused", "connection reset",
    "dns error", "operation timed out", "timed out", "broken pipe", "connection closed",
)
_FULL = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122",
         "file too large", "os error 27", "entitytoolarge")
_NOT_WRITABLE = ("read-only file system", "os error 30", "permission denied", "os error 13",
                 "operation not permitted", "accessdenied", "access denied")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ENDPOINT = re.compile(r"(https?://[^/\s?]+)")

# What a failed write of each path leaves, and how to go on without writing anything twice.
_PLAIN = ("the commit may have landed (if the store took it before the fault): a plain append has "
          "no sequence, so do not resend the same batch blindly (it would be written twice); "
          "first look whether it landed (the partition's next offset, Queue.next_offset, or the "
          "newest commit in `cues queue show`) and send only what is missing, or send through "
          "a Producer, whose sequence makes a resend of a landed batch a no-op; a processor's "
          "step is recovered from its records")
CONSEQUENCE = {
    "commit": _PLAIN,
    "send": ("the send may have landed: resend the same batch with the same producer (its "
             "sequence makes a landed one a no-op; the producer accepts nothing else until then)"),
    "decide": ("the transaction's decision may have landed: call commit() (or abort()) again on "
               "the same producer: it reads the coordinator, finishes the one decision that "
               "landed and never decides twice"),
    "roll-forward": ("the decision is recorded; call commit() again on the same producer to "
                     "finish rolling it forward onto the queues (each marker is written once)"),
    "position": ("the position may have been stored: commit the same position again (storing "
                 "one twice changes nothing)"),
}
_DOING = {"commit": "committing", "send": "committing a send",
          "decide": "recording a transaction's decision", "roll-forward": "rolling a decision forward",
          "position": "storing a position", "open": "opening it", "refresh": "reading its log",
          "list": "listing the lake"}
WRITES = frozenset(CONSEQUENCE)


def _reason(text: str) -> str:
    lines = [ln.strip().lstrip("↳").strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown"


def storage_fault(exc: BaseException, *, table: str, uri: str, during: str) -> QueueError | None:
    """The typed error for a storage exception ``exc`` raised while ``during`` (see the module
    docstring), or None when it is not a storage fault this module knows."""
    if not isinstance(exc, (OSError, DeltaError)):
        return None
    text = _ANSI.sub("", str(exc))
    low = text.lower()
    reason = _reason(text) if text.strip() else type(exc).__name__
    doing = _DOING.get(during, during)
    after = CONSEQUENCE.get(during, "nothing was written")
    data = {"table": table, "uri": uri, "during": during, "reason": reason}
    if any(m in low for m in _MARKERS):
        return unreachable(exc, table=table, uri=uri, during=during)
    if any(m in low for m in _FULL):
        return StorageFullError(
            f"{table}: the lake's storage is full while {doing} ({reason}); {after}. Free space "
            f"at {uri} (or raise the quota), then go on", **data)
    if any(m in low for m in _NOT_WRITABLE):
        return StorageNotWritableError(
            f"{table}: the lake's storage refuses writes while {doing} ({reason}): it is "
            f"read-only or not writable by this user; {after}. Mount {uri} read-write or fix its "
            "permissions (or credentials), then go on", **data)
    if during in WRITES and type(exc) is OSError:  # object_store's "Generic ... error"
        return CommitOutcomeUnknownError(
            f"{table}: the store failed the request while {doing} ({reason}) without saying "
            f"whether it was done; {after}", **data)
    return None


def unreachable(exc: BaseException, *, table: str, uri: str, during: str) -> StorageUnreachableError | None:
    """The typed error for ``exc`` when it says the store did not answer, else None."""
    if not isinstance(exc, (OSError, DeltaError)):
        return None
    text = _ANSI.sub("", str(exc))
    if not any(m in text.lower() for m in _MARKERS):
        return None
    reason = _reason(text) if text.strip() else type(exc).__name__
    found = _ENDPOINT.search(text)
    endpoint = found.group(1) if found else None
    where = f"the object store at {endpoint}" if endpoint else "the lake's object store"
    after = CONSEQUENCE.get(during, "nothing was written")
    return StorageUnreachableError(
        f"{table}: {where} did not answer while {_DOING.get(during, during)} ({reason}), after "
        f"delta-rs' retries; {after}. Check the endpoint (AWS_ENDPOINT_URL), the network and the "
        "credentials, then retry (the retries are the storage options max_retries and "
        "retry_timeout)",
        table=table, uri=uri, endpoint=endpoint, during=during, reason=reason)


@contextmanager
def translated(*, table: str, uri: str, during: str) -> Iterator[None]:
    """Inside the block, a storage fault raises its typed error (:func:`storage_fault`)."""
    try:
        yield
    except (OSError, DeltaError) as exc:
        error = storage_fault(exc, table=table, uri=uri, during=during)
        if error is None:
            raise
        raise error from exc


__all__ = ["CONSEQUENCE", "storage_fault", "translated", "unreachable"]
