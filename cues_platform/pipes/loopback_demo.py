"""Run half of an exactly-once pipe in this process, the other half in another one.

The composed pipe is a continuous index pipe over a re-send-multi pipe (see
:mod:`cues_platform.pipes.compose`); here its two halves are split across processes:

* :func:`sender_half`: index sender → re-send-multi sender → (fault injector) → UDP;
* :func:`receiver_half`: UDP → re-send receiver → continuous index receiver → outbox.

``python -m cues_platform.pipes.loopback_demo receiver`` runs the receiver half: it prints
``{"port": N}``, serves until its stdin is closed, then prints ``{"received": [...]}``.
"""

from __future__ import annotations

import json
import select
import sys
from dataclasses import dataclass
from typing import Any

from .index import Check, ContinuousIndexReceiver, IndexSender
from .loopback import LoopbackEndpoint, run_networked
from .resend import ResendConfig, ResendMultiSender, ResendReceiver
from .routes import LOSSLESS, FaultSchedule, FaultyLink, Route
from .sim import Simulation
from .workers import Outbox


class SubmitLink:
    """The sending end of an inner pipe as a link: ``send`` submits to its sender."""

    def __init__(self, sender: ResendMultiSender) -> None:
        self.sender = sender

    def send(self, item: Any) -> None:
        self.sender.submit(item)

    def receive(self) -> list[Any]:
        return []


class OutboxLink:
    """The receiving end of an inner pipe as a link: ``receive`` drains its outbox."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox

    def send(self, item: Any) -> None:
        raise NotImplementedError("the receiving half only receives")

    def receive(self) -> list[Any]:
        return self.outbox.drain()


@dataclass
class SenderHalf:
    sim: Simulation
    endpoint: LoopbackEndpoint
    inner: ResendMultiSender
    outer: IndexSender


def sender_half(
    *, peer_port: int, faults: FaultSchedule = LOSSLESS, timeout: int = 20
) -> SenderHalf:
    sim = Simulation()
    endpoint = LoopbackEndpoint(peer_port=peer_port)
    wire = FaultyLink(sim.clock, faults, name="wire", inner=endpoint)
    inner = ResendMultiSender(
        name="eo.inner.sender", route=Route(wire, endpoint), config=ResendConfig(timeout)
    )
    outer = IndexSender(name="eo.outer.sender", forward=SubmitLink(inner))
    sim.add(wire, inner, outer)
    return SenderHalf(sim, endpoint, inner, outer)


def receiver_half(endpoint: LoopbackEndpoint) -> tuple[Simulation, Outbox]:
    sim = Simulation()
    inner_out, out = Outbox(), Outbox()
    inner = ResendReceiver(
        name="eo.inner.receiver", route=Route(endpoint, endpoint), outbox=inner_out
    )
    outer = ContinuousIndexReceiver(
        name="eo.outer.receiver", forward=OutboxLink(inner_out), outbox=out, check=Check.STRICT
    )
    sim.add(inner, outer)
    return sim, out


class _StdinWatch:
    """Selectable stdin; :meth:`closed` turns true once the parent closes our stdin."""

    def __init__(self) -> None:
        self._closed = False

    def fileno(self) -> int:
        return sys.stdin.fileno()

    def closed(self) -> bool:
        if not self._closed:
            readable, _, _ = select.select([sys.stdin], [], [], 0)
            self._closed = bool(readable) and not sys.stdin.readline()
        return self._closed


def _serve_receiver(max_ticks: int) -> int:
    with LoopbackEndpoint() as endpoint:
        print(json.dumps({"port": endpoint.port}), flush=True)
        sim, out = receiver_half(endpoint)
        stdin = _StdinWatch()
        received: list[Any] = []

        def until() -> bool:
            received.extend(out.drain())
            return stdin.closed()

        finished = run_networked(sim, [endpoint, stdin], until=until, max_ticks=max_ticks)
        print(json.dumps({"received": received, "finished": finished}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "receiver":
        print("usage: python -m cues_platform.pipes.loopback_demo receiver [max_ticks]")
        return 2
    return _serve_receiver(int(args[1]) if len(args) > 1 else 500_000)


if __name__ == "__main__":
    raise SystemExit(main())
