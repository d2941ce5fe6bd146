"""Workers that can crash and restart, and the :class:`Pipe` base class.

A worker's *in-memory state* is everything built by :meth:`Worker._reset`. :meth:`Worker.crash`
throws it away; while down, the worker drains and discards whatever reaches its inbound links
(nobody is listening); :meth:`Worker.restart` starts over from a fresh state. Anything that must
survive a crash has to live outside the worker, in a storage object passed to it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable
from enum import Enum
from typing import Any

from .errors import WorkerDownError
from .routes import Link
from .sim import Composite, Tickable


class Status(Enum):
    UP = "up"
    DOWN = "down"


class Worker(ABC):
    """Base class of every pipe worker (sender, receiver, stream engine, index storage)."""

    def __init__(self, *, name: str) -> None:
        self.name = name
        self.status = Status.UP
        self.incarnation = 0
        self.crashes = 0
        self.discarded = 0
        self._reset()

    @property
    def up(self) -> bool:
        return self.status is Status.UP

    @abstractmethod
    def _reset(self) -> None:
        """(Re)build all in-memory state."""

    @abstractmethod
    def _inbound(self) -> Iterable[Link]:
        """Links this worker listens on."""

    @abstractmethod
    def _step(self, now: int) -> None:
        """Act once while up: consume inbound envelopes, send, handle time-outs."""

    def tick(self, now: int) -> None:
        if self.up:
            self._step(now)
            return
        for link in self._inbound():
            self.discarded += len(link.receive())

    def crash(self) -> None:
        """Lose all in-memory state; stay down until :meth:`restart`."""
        self.status = Status.DOWN
        self.crashes += 1
        self._reset()

    def restart(self) -> None:
        """Come back up with fresh in-memory state (a new incarnation, like a new process)."""
        self.incarnation += 1
        self.status = Status.UP
        self._reset()

    def _require_up(self) -> None:
        if not self.up:
            raise WorkerDownError(self.name)

    def _new_id(self, seq: int) -> str:
        return f"{self.name}/{self.incarnation}/{seq}"


class Outbox:
    """Where a receiver *sends* messages on: a lossless local hand-off to the consumer.

    It belongs to the pipe, not to the receiver's memory: a message put here has left the pipe.
    """

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self.total = 0

    def put(self, item: Any) -> None:
        self._items.append(item)
        self.total += 1

    def drain(self) -> list[Any]:
        out = list(self._items)
        self._items.clear()
        return out

    def __len__(self) -> int:
        return len(self._items)


class Pipe(ABC):
    """A sender, a receiver, and routes between them; usable itself as a :class:`Link`.

    ``submit`` hands a payload to the sender (raises :class:`WorkerDownError` if it is down);
    ``send`` is the fire-and-forget :class:`Link` form used when this pipe is the route of an
    outer pipe (a payload sent to a crashed sender is lost, as with a dead process);
    ``receive`` returns what the receiver has sent on since the last call.
    """

    sender: Any
    receiver: Any

    def __init__(self) -> None:
        self.outbox = Outbox()
        self.lost_on_send = 0

    @abstractmethod
    def workers(self) -> list[Worker]:
        """All workers of this pipe (not of inner pipes)."""

    @abstractmethod
    def links(self) -> list[Link]:
        """All links this pipe's workers use (inner pipes included)."""

    def submit(self, payload: Any) -> None:
        self.sender.submit(payload)

    def send(self, item: Any) -> None:
        if self.sender.up:
            self.sender.submit(item)
        else:
            self.lost_on_send += 1

    def receive(self) -> list[Any]:
        return self.outbox.drain()

    def tickables(self) -> list[Tickable]:
        out: list[Tickable] = []
        for link in self.links():
            if isinstance(link, Composite):
                out.extend(link.tickables())
            elif isinstance(link, Tickable):
                out.append(link)
        out.extend(self.workers())
        return out
