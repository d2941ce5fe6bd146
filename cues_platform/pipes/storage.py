"""Persistent storage protocols for the stream pipe, with in-memory implementations.

A :class:`StreamStore` appends payloads at monotonic offsets (0, 1, 2, ...) and reads them back
from an offset. An :class:`IndexStore` keeps the stream receiver's committed position. The
in-memory implementations are *the storage*, not worker memory: they are handed to workers and
survive worker crashes. :meth:`MemoryStreamStore.lose_from` simulates the one fault the stream
pipe does not tolerate, data loss in the storage.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .errors import StorageError


@runtime_checkable
class StreamStore(Protocol):
    """Append-only log with monotonic offsets."""

    def append(self, payload: Any) -> int:
        """Store ``payload``; return its offset (one more than the previous offset)."""
        ...

    def read(self, start: int, limit: int) -> list[tuple[int, Any]]:
        """Return up to ``limit`` ``(offset, payload)`` pairs with offsets ``>= start``, in order."""
        ...

    def end(self) -> int:
        """The offset the next append will get (0 for an empty store)."""
        ...


@runtime_checkable
class IndexStore(Protocol):
    """Where a stream receiver commits its position (next offset to read)."""

    def load(self) -> int | None: ...

    def commit(self, position: int) -> None: ...


class MemoryStreamStore:
    """In-memory :class:`StreamStore`; lives outside workers, so it survives their crashes."""

    def __init__(self) -> None:
        self._log: list[Any] = []

    def append(self, payload: Any) -> int:
        self._log.append(payload)
        return len(self._log) - 1

    def read(self, start: int, limit: int) -> list[tuple[int, Any]]:
        if start < 0 or limit < 1:
            raise StorageError(f"bad read window start={start} limit={limit}")
        return [(off, self._log[off]) for off in range(start, min(start + limit, len(self._log)))]

    def end(self) -> int:
        return len(self._log)

    def lose_from(self, offset: int) -> int:
        """Simulate storage data loss: forget every offset ``>= offset``; return how many."""
        lost = max(0, len(self._log) - offset)
        del self._log[offset:]
        return lost


class MemoryIndexStore:
    """In-memory :class:`IndexStore`; keeps the highest committed position."""

    def __init__(self) -> None:
        self.position: int | None = None
        self.commits = 0

    def load(self) -> int | None:
        return self.position

    def commit(self, position: int) -> None:
        if position < 0:
            raise StorageError(f"negative position {position}")
        self.commits += 1
        # Commits can arrive reordered over a faulty route: never move backwards.
        if self.position is None or position > self.position:
            self.position = position
