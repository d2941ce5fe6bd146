"""Index pipes: the strict monotonic index pipe and the continuous index pipe (send queue).

Both senders tag payloads with consecutive indexes starting at 1; both receivers remember the
index of the last payload they sent on (0 before the first). The :class:`Check` decides whether a
payload carrying the *current* index again is sent on (``RELAXED``, the seed's ``<=``) or
dropped (``STRICT``, the seed's ``<``).

Strict monotonic index pipe — contract:

* ``STRICT``: **strictly monotonic** (loss possible — any payload that arrives after a later one
  is dropped — but no duplicates, never backwards); ``RELAXED``: **monotonic** (also adjacent
  duplicates);
* tolerates any route fault as long as the route is eventually accessible (it only loses what
  the route or the ordering check loses);
* does **not** tolerate sender or receiver crashes: a restarted sender re-uses low indexes that
  the receiver drops; a restarted receiver forgets its index and sends late payloads backwards.

Continuous index pipe (send queue) — contract:

* over an **at-least-once** route, ``STRICT`` is **absolutely ordered** (exactly the submitted
  payloads, in order, no loss, no duplicates) and ``RELAXED`` is **continuously ordered** (in
  order, no gaps, adjacent duplicates possible); over a lossy route it stalls at the first gap;
* does **not** tolerate sender or receiver crashes (indexes restart / the current index and the
  send queue are lost).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Any

from .messages import Indexed
from .routes import Link
from .workers import Outbox, Pipe, Worker


class Check(Enum):
    """Receiver check: ``STRICT`` sends on only ``index > current``; ``RELAXED`` ``>=``."""

    STRICT = "<"
    RELAXED = "<="

    def repeats(self, index: int, current: int) -> bool:
        """Whether a payload carrying the current index again is sent on."""
        return self is Check.RELAXED and index == current


class IndexSender(Worker):
    """Keeps the last assigned index; sends each payload at once, tagged with the next index."""

    def __init__(self, *, name: str, forward: Link) -> None:
        self.forward = forward
        super().__init__(name=name)

    def _reset(self) -> None:
        self.last_index = 0

    def _inbound(self) -> Iterable[Link]:
        return ()

    def submit(self, payload: Any) -> None:
        self._require_up()
        self.last_index += 1
        self.forward.send(Indexed(self.last_index, payload))

    def _step(self, now: int) -> None:
        pass


class StrictIndexReceiver(Worker):
    """Keeps the last sent index; sends on a payload only if its index passes the check."""

    def __init__(self, *, name: str, forward: Link, outbox: Outbox, check: Check) -> None:
        self.forward = forward
        self.outbox = outbox
        self.check = check
        self.dropped = 0
        super().__init__(name=name)

    def _reset(self) -> None:
        self.current = 0

    def _inbound(self) -> Iterable[Link]:
        return (self.forward,)

    def _step(self, now: int) -> None:
        for item in self.forward.receive():
            if not isinstance(item, Indexed):
                continue
            if item.index > self.current or self.check.repeats(item.index, self.current):
                self.outbox.put(item.payload)
                self.current = item.index
            else:
                self.dropped += 1


class ContinuousIndexReceiver(Worker):
    """Keeps the current index and a send queue of payloads that arrived ahead of their turn."""

    def __init__(self, *, name: str, forward: Link, outbox: Outbox, check: Check) -> None:
        self.forward = forward
        self.outbox = outbox
        self.check = check
        self.dropped = 0
        super().__init__(name=name)

    def _reset(self) -> None:
        self.current = 0
        self.queue: dict[int, Any] = {}

    def _inbound(self) -> Iterable[Link]:
        return (self.forward,)

    def _step(self, now: int) -> None:
        for item in self.forward.receive():
            if not isinstance(item, Indexed):
                continue
            if item.index == self.current + 1:
                self.outbox.put(item.payload)
                self.current = item.index
                while self.current + 1 in self.queue:
                    self.current += 1
                    self.outbox.put(self.queue.pop(self.current))
            elif item.index > self.current + 1:
                self.queue.setdefault(item.index, item.payload)
            elif self.check.repeats(item.index, self.current):
                self.outbox.put(item.payload)
            else:
                self.dropped += 1


class StrictIndexPipe(Pipe):
    """Strict monotonic index pipe (``Check.RELAXED`` gives the monotonic ``<=`` variant)."""

    def __init__(self, forward: Link, *, check: Check = Check.STRICT, name: str = "index") -> None:
        super().__init__()
        self.forward = forward
        self.sender = IndexSender(name=f"{name}.sender", forward=forward)
        self.receiver = StrictIndexReceiver(
            name=f"{name}.receiver", forward=forward, outbox=self.outbox, check=check
        )

    def workers(self) -> list[Worker]:
        return [self.sender, self.receiver]

    def links(self) -> list[Link]:
        return [self.forward]


class ContinuousIndexPipe(Pipe):
    """Continuous index pipe with a send queue; ``forward`` must be at-least-once."""

    def __init__(
        self, forward: Link, *, check: Check = Check.STRICT, name: str = "continuous"
    ) -> None:
        super().__init__()
        self.forward = forward
        self.sender = IndexSender(name=f"{name}.sender", forward=forward)
        self.receiver = ContinuousIndexReceiver(
            name=f"{name}.receiver", forward=forward, outbox=self.outbox, check=check
        )

    def workers(self) -> list[Worker]:
        return [self.sender, self.receiver]

    def links(self) -> list[Link]:
        return [self.forward]
