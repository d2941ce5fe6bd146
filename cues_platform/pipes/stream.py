"""Stream pipe: a pipe with persistent storage.

The sender puts each payload into the stream (``Append``) and re-sends it until the stream
engine confirms it (``Appended``); the engine stores payloads in a :class:`StreamStore` at
monotonic offsets; the receiver fetches from its current offset and sends payloads on. With an
optional :class:`IndexStore` the receiver loads its position on start and commits it after
sending a batch on.

Delivery contract:

* **at-least-once, duplicates possible** (a lost ``Appended`` makes the sender append again; a
  receiver restart re-reads from its last commit, or from 0 without an index store);
* tolerates faults in the routes sender↔stream, receiver↔stream and receiver↔index storage,
  crashes of the receiver, of the stream engine and of the index storage worker;
* does **not** tolerate sender crashes (unconfirmed payloads live in sender memory) nor data
  loss in the storage (a confirmed payload that the storage forgets is never delivered).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .errors import ConfigError
from .messages import Append, Appended, Batch, CommitIndex, Fetch, IndexValue, ReadIndex
from .resend import ResendConfig, ResendMultiSender
from .routes import Link, Route
from .storage import IndexStore, StreamStore
from .workers import Outbox, Pipe, Worker


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """Time-outs in ticks; ``batch`` is the fetch size, ``poll`` the wait after an empty fetch."""

    append_timeout: int = 8
    fetch_timeout: int = 8
    batch: int = 16
    poll: int = 2

    def __post_init__(self) -> None:
        if min(self.append_timeout, self.fetch_timeout, self.batch, self.poll) < 1:
            raise ConfigError("stream time-outs, batch and poll must all be >= 1")


class StreamSender(ResendMultiSender):
    """Appends to the stream and re-sends each append until it is confirmed with an offset."""

    def __init__(self, *, name: str, route: Route, config: StreamConfig) -> None:
        super().__init__(name=name, route=route, config=ResendConfig(config.append_timeout))

    def _wrap(self, msg_id: str, payload: Any) -> Any:
        return Append(msg_id, payload)

    def _confirmed_id(self, item: Any) -> str | None:
        if isinstance(item, Appended):
            return item.msg_id
        return None


class StreamEngine(Worker):
    """Serves appends and fetches against its storage; keeps no state of its own."""

    def __init__(self, *, name: str, store: StreamStore, writers: Route, readers: Route) -> None:
        self.store = store
        self.writers = writers
        self.readers = readers
        super().__init__(name=name)

    def _reset(self) -> None:
        pass

    def _inbound(self) -> Iterable[Link]:
        return (self.writers.forward, self.readers.forward)

    def _step(self, now: int) -> None:
        for item in self.writers.forward.receive():
            if isinstance(item, Append):
                self.writers.back.send(Appended(item.msg_id, self.store.append(item.payload)))
        for item in self.readers.forward.receive():
            if isinstance(item, Fetch):
                entries = tuple(self.store.read(item.start, item.limit))
                self.readers.back.send(Batch(item.request_id, item.start, entries))


class IndexStorage(Worker):
    """Serves ``ReadIndex`` and ``CommitIndex`` against an :class:`IndexStore`."""

    def __init__(self, *, name: str, store: IndexStore, route: Route) -> None:
        self.store = store
        self.route = route
        super().__init__(name=name)

    def _reset(self) -> None:
        pass

    def _inbound(self) -> Iterable[Link]:
        return (self.route.forward,)

    def _step(self, now: int) -> None:
        for item in self.route.forward.receive():
            if isinstance(item, ReadIndex):
                self.route.back.send(IndexValue(item.request_id, self.store.load()))
            elif isinstance(item, CommitIndex):
                self.store.commit(item.position)


class Phase(Enum):
    LOADING = "loading"  # waiting for the committed position from the index storage
    FETCHING = "fetching"


class StreamReceiver(Worker):
    """Fetches from its current offset, sends payloads on, optionally commits its position.

    In-memory state: phase, position (next offset to read), the outstanding fetch or index read.
    """

    def __init__(
        self,
        *,
        name: str,
        stream: Route,
        index: Route | None,
        outbox: Outbox,
        config: StreamConfig,
    ) -> None:
        self.stream = stream
        self.index = index
        self.outbox = outbox
        self.config = config
        self._request = 0  # request ids stay unique across restarts (like a process-wide counter)
        super().__init__(name=name)

    def _reset(self) -> None:
        self.phase = Phase.FETCHING if self.index is None else Phase.LOADING
        self.position = 0
        self.outstanding: int | None = None
        self.sent_at = 0
        self.idle_until = 0

    def _inbound(self) -> Iterable[Link]:
        if self.index is None:
            return (self.stream.back,)
        return (self.stream.back, self.index.back)

    def _next_request(self, now: int) -> int:
        self._request += 1
        self.outstanding, self.sent_at = self._request, now
        return self._request

    def _timed_out(self, now: int, timeout: int) -> bool:
        return self.outstanding is None or now - self.sent_at >= timeout

    def _step(self, now: int) -> None:
        if self.index is not None:
            for item in self.index.back.receive():
                if (
                    isinstance(item, IndexValue)
                    and self.phase is Phase.LOADING
                    and item.request_id == self.outstanding
                ):
                    self.position = item.position or 0
                    self.phase, self.outstanding = Phase.FETCHING, None
            if self.phase is Phase.LOADING:
                if self._timed_out(now, self.config.fetch_timeout):
                    self.index.forward.send(ReadIndex(self._next_request(now)))
                return
        for item in self.stream.back.receive():
            if isinstance(item, Batch) and item.request_id == self.outstanding:
                self.outstanding = None
                self._deliver(item, now)
        idle = self.outstanding is None and now >= self.idle_until
        lost = self.outstanding is not None and now - self.sent_at >= self.config.fetch_timeout
        if idle or lost:
            fetch = Fetch(self._next_request(now), self.position, self.config.batch)
            self.stream.forward.send(fetch)

    def _deliver(self, batch: Batch, now: int) -> None:
        if batch.start != self.position:
            return
        if not batch.entries:
            self.idle_until = now + self.config.poll
            return
        for offset, payload in batch.entries:
            self.outbox.put(payload)
            self.position = offset + 1
        if self.index is not None:
            self.index.forward.send(CommitIndex(self.position))


class StreamPipe(Pipe):
    """Stream pipe over ``store``; pass ``index_store`` to enable the optional index storage."""

    def __init__(
        self,
        *,
        store: StreamStore,
        writer_route: Route,
        reader_route: Route,
        index_store: IndexStore | None = None,
        index_route: Route | None = None,
        config: StreamConfig | None = None,
        name: str = "stream",
    ) -> None:
        super().__init__()
        if (index_store is None) != (index_route is None):
            raise ConfigError("index_store and index_route go together")
        cfg = config or StreamConfig()
        self.store = store
        self._routes = [writer_route, reader_route] + ([index_route] if index_route else [])
        self.sender = StreamSender(name=f"{name}.sender", route=writer_route, config=cfg)
        self.engine = StreamEngine(
            name=f"{name}.engine", store=store, writers=writer_route, readers=reader_route
        )
        self.index_storage = (
            IndexStorage(name=f"{name}.index", store=index_store, route=index_route)
            if index_store is not None and index_route is not None
            else None
        )
        self.receiver = StreamReceiver(
            name=f"{name}.receiver",
            stream=reader_route,
            index=index_route,
            outbox=self.outbox,
            config=cfg,
        )

    def workers(self) -> list[Worker]:
        extra = [self.index_storage] if self.index_storage is not None else []
        return [self.sender, self.engine, *extra, self.receiver]

    def links(self) -> list[Link]:
        return [link for route in self._routes for link in (route.forward, route.back)]
