"""Storage faults of an object-store lake as one typed line: :class:`StorageUnreachableError`.

delta-rs (object_store) retries a request that gets no answer, then raises an ``OSError`` or a
``DeltaError`` whose message is a multi-line chain with terminal colours ("Generic S3 error ↳
Error performing GET http://… ↳ error sending request ↳ tcp connect error ↳ Connection refused").
:func:`unreachable` recognizes that chain and turns it into one line naming the table, the
endpoint, what was being done and what to do; any other error is left alone (None).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from deltalake.exceptions import DeltaError

from cues_platform.queues.errors import StorageUnreachableError

_MARKERS = (
    "error sending request", "tcp connect error", "connection refused", "connection reset",
    "dns error", "operation timed out", "timed out", "broken pipe", "connection closed",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ENDPOINT = re.compile(r"(https?://[^/\s?]+)")
_CONSEQUENCE = {
    "commit": ("the commit may have landed if its request reached the store before the fault: "
               "resend the same batch with the same producer (its sequence makes a landed one a "
               "no-op); a processor's step is recovered from its records"),
}


def unreachable(exc: BaseException, *, table: str, uri: str, during: str) -> StorageUnreachableError | None:
    """The typed error for ``exc`` when it says the store did not answer, else None."""
    if not isinstance(exc, (OSError, DeltaError)):
        return None
    text = _ANSI.sub("", str(exc))
    if not any(m in text.lower() for m in _MARKERS):
        return None
    lines = [ln.strip().lstrip("↳").strip() for ln in text.splitlines() if ln.strip()]
    reason = lines[-1] if lines else type(exc).__name__
    found = _ENDPOINT.search(text)
    endpoint = found.group(1) if found else None
    where = f"the object store at {endpoint}" if endpoint else "the lake's object store"
    after = _CONSEQUENCE.get(during, "nothing was written")
    return StorageUnreachableError(
        f"{table}: {where} did not answer while {_DOING.get(during, during)} ({reason}), after "
        f"delta-rs' retries; {after}. Check the endpoint (AWS_ENDPOINT_URL), the network and the "
        "credentials, then retry (the retries are the storage options max_retries and "
        "retry_timeout)",
        table=table, uri=uri, endpoint=endpoint, during=during, reason=reason)


_DOING = {"commit": "committing", "open": "opening it", "refresh": "reading its log",
          "list": "listing the lake"}


@contextmanager
def translated(*, table: str, uri: str, during: str) -> Iterator[None]:
    """Inside the block, an unreachable store raises :class:`StorageUnreachableError`."""
    try:
        yield
    except (OSError, DeltaError) as exc:
        error = unreachable(exc, table=table, uri=uri, during=during)
        if error is None:
            raise
        raise error from exc


__all__ = ["translated", "unreachable"]
