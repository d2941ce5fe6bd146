"""Reliable delivery by re-sending: the re-send pipe and its multi-unconfirmed variant.

Delivery contract (both pipes):

* **at-least-once, duplicates possible**: every payload submitted to a sender that does not
  crash is eventually sent on by the receiver, provided the route lets some attempt and its
  confirm through (drops, duplicates, delays, reordering and temporary partitions are tolerated);
* receiver crashes are tolerated (the receiver keeps no state; unconfirmed messages are re-sent);
* sender crashes are **not** tolerated: the unconfirmed message(s) and the buffer live in the
  sender's memory and are lost.

:class:`ResendPipe` keeps one unconfirmed message and buffers the rest behind it;
:class:`ResendMultiPipe` sends everything at once and tracks all unconfirmed messages.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .messages import Confirm, Data
from .routes import Link, Route
from .workers import Outbox, Pipe, Worker


@dataclass(frozen=True, slots=True)
class ResendConfig:
    """``timeout``: ticks to wait for a confirm before sending the same message again."""

    timeout: int = 8

    def __post_init__(self) -> None:
        if self.timeout < 1:
            raise ConfigError(f"timeout must be >= 1 tick, got {self.timeout}")


class ResendSender(Worker):
    """Keeps the current unconfirmed message and its id, and a buffer of messages behind it."""

    def __init__(self, *, name: str, route: Route, config: ResendConfig | None) -> None:
        self.route = route
        self.config = config
        self.confirmed = 0
        self.resent = 0
        super().__init__(name=name)

    def _reset(self) -> None:
        self.current: Data | None = None
        self.sent_at = 0
        self.buffer: deque[Data] = deque()
        self._seq = 0

    def _inbound(self) -> Iterable[Link]:
        return (self.route.back,)

    def submit(self, payload: Any) -> None:
        self._require_up()
        self._seq += 1
        self.buffer.append(Data(self._new_id(self._seq), payload))

    @property
    def pending(self) -> int:
        return len(self.buffer) + (self.current is not None)

    def _step(self, now: int) -> None:
        for item in self.route.back.receive():
            if (
                isinstance(item, Confirm)
                and self.current is not None
                and item.msg_id == self.current.msg_id
            ):
                self.current = None
                self.confirmed += 1
        if self.current is None and self.buffer:
            self.current = self.buffer.popleft()
            self.route.forward.send(self.current)
            self.sent_at = now
        elif (
            self.current is not None
            and self.config is not None
            and now - self.sent_at >= self.config.timeout
        ):
            self.route.forward.send(self.current)
            self.sent_at = now
            self.resent += 1


class ResendMultiSender(Worker):
    """Sends every message at once and keeps all unconfirmed messages with their ids."""

    def __init__(self, *, name: str, route: Route, config: ResendConfig) -> None:
        self.route = route
        self.config = config
        self.confirmed = 0
        self.resent = 0
        super().__init__(name=name)

    def _reset(self) -> None:
        self.unconfirmed: dict[str, tuple[Any, int]] = {}
        self._fresh: deque[tuple[str, Any]] = deque()
        self._seq = 0

    def _inbound(self) -> Iterable[Link]:
        return (self.route.back,)

    def _wrap(self, msg_id: str, payload: Any) -> Any:
        return Data(msg_id, payload)

    def _confirmed_id(self, item: Any) -> str | None:
        return item.msg_id if isinstance(item, Confirm) else None

    def submit(self, payload: Any) -> None:
        self._require_up()
        self._seq += 1
        msg_id = self._new_id(self._seq)
        self._fresh.append((msg_id, self._wrap(msg_id, payload)))

    @property
    def pending(self) -> int:
        return len(self.unconfirmed) + len(self._fresh)

    def _step(self, now: int) -> None:
        for item in self.route.back.receive():
            msg_id = self._confirmed_id(item)
            if msg_id is not None and self.unconfirmed.pop(msg_id, None):
                self.confirmed += 1
        while self._fresh:
            msg_id, msg = self._fresh.popleft()
            self.unconfirmed[msg_id] = (msg, now)
            self.route.forward.send(msg)
        # The dict is ordered by last send time (re-sent entries move to the end), so only
        # its head can be due: re-sending costs O(due), not O(unconfirmed), per tick.
        while self.unconfirmed:
            msg_id, (msg, sent_at) = next(iter(self.unconfirmed.items()))
            if now - sent_at < self.config.timeout:
                break
            del self.unconfirmed[msg_id]
            self.unconfirmed[msg_id] = (msg, now)
            self.route.forward.send(msg)
            self.resent += 1


class ResendReceiver(Worker):
    """Stateless: sends each received payload on, then confirms its id on the back link."""

    def __init__(self, *, name: str, route: Route, outbox: Outbox) -> None:
        self.route = route
        self.outbox = outbox
        super().__init__(name=name)

    def _reset(self) -> None:
        pass

    def _inbound(self) -> Iterable[Link]:
        return (self.route.forward,)

    def _step(self, now: int) -> None:
        for item in self.route.forward.receive():
            if isinstance(item, Data):
                self.outbox.put(item.payload)
                self.route.back.send(Confirm(item.msg_id))


class ResendPipe(Pipe):
    """Re-send pipe: one unconfirmed message, a buffer behind it. At-least-once."""

    def __init__(
        self, route: Route, *, config: ResendConfig | None = None, name: str = "resend"
    ) -> None:
        super().__init__()
        self.route = route
        self.sender = ResendSender(
            name=f"{name}.sender", route=route, config=config or ResendConfig()
        )
        self.receiver = ResendReceiver(name=f"{name}.receiver", route=route, outbox=self.outbox)

    def workers(self) -> list[Worker]:
        return [self.sender, self.receiver]

    def links(self) -> list[Link]:
        return [self.route.forward, self.route.back]


class ResendMultiPipe(Pipe):
    """Re-send pipe with multiple unconfirmed messages. At-least-once."""

    def __init__(
        self, route: Route, *, config: ResendConfig | None = None, name: str = "resend-multi"
    ) -> None:
        super().__init__()
        self.route = route
        self.sender = ResendMultiSender(
            name=f"{name}.sender", route=route, config=config or ResendConfig()
        )
        self.receiver = ResendReceiver(name=f"{name}.receiver", route=route, outbox=self.outbox)

    def workers(self) -> list[Worker]:
        return [self.sender, self.receiver]

    def links(self) -> list[Link]:
        return [self.route.forward, self.route.back]
