"""Sequential confirm pipe (send queue).

The sender sends one message, waits for the receiver's confirm, and only then sends the next;
everything else waits in its buffer. It never re-sends: it relies on its routes.

Delivery contract:

* **continuously ordered**: payloads are sent on in submission order with no gaps; a payload
  may repeat (a duplicate delivered by the inner route is sent on and confirmed again) but only
  right after itself. This needs both routes to be **at-least-once** (a lost message or confirm
  stalls the pipe for ever) and to deliver a duplicate before anything sent after it (a stale
  duplicate arriving late would be sent on out of order);
* does **not** tolerate a sender crash (the buffer is lost) nor a receiver crash (a message that
  reaches a crashed receiver is never confirmed, so the sender waits for ever);
* throughput is one message per round trip, which is why the seed calls it "not very useful".
"""

from __future__ import annotations

from .messages import Data
from .resend import ResendReceiver, ResendSender
from .routes import Link, Route
from .workers import Pipe, Worker


class SequentialSender(ResendSender):
    """A :class:`ResendSender` with re-sending switched off: wait for each confirm, for ever."""

    def __init__(self, *, name: str, route: Route) -> None:
        super().__init__(name=name, route=route, config=None)

    @property
    def waiting_for(self) -> Data | None:
        return self.current


class SequentialReceiver(ResendReceiver):
    """Sends each received payload on, then confirms it (no state, no de-duplication)."""


class SequentialConfirmPipe(Pipe):
    """Sequential confirm pipe. ``route``'s links must both be at-least-once (e.g. pipes)."""

    def __init__(self, route: Route, *, name: str = "sequential") -> None:
        super().__init__()
        self.route = route
        self.sender = SequentialSender(name=f"{name}.sender", route=route)
        self.receiver = SequentialReceiver(name=f"{name}.receiver", route=route, outbox=self.outbox)

    def workers(self) -> list[Worker]:
        return [self.sender, self.receiver]

    def links(self) -> list[Link]:
        return [self.route.forward, self.route.back]
