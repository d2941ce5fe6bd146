"""Loopback network route: pipes between processes over UDP on 127.0.0.1.

A :class:`LoopbackEndpoint` is a duplex :class:`~cues_platform.pipes.routes.Link` over one UDP
socket bound to ``127.0.0.1`` (never another interface). Use the same endpoint as both the
forward and the back link of a :class:`~cues_platform.pipes.routes.Route`. The receiving side
may be created without a peer: it learns the peer from the first datagram it receives.

UDP may drop or reorder datagrams, which the pipes tolerate as they tolerate the in-memory
faults; for deterministic extra faults wrap the endpoint: ``FaultyLink(clock, sched,
inner=endpoint)``.

:func:`run_networked` is the process main loop: one tick per iteration; when nothing is
readable it blocks in ``select`` for at most ``wait`` seconds (waiting for I/O, not sleeping),
so time-outs measured in ticks correspond roughly to multiples of ``wait`` when idle.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import CodecError, RouteError
from .messages import decode, encode
from .sim import Simulation

LOOPBACK = "127.0.0.1"
MAX_DATAGRAM = 65_507


@dataclass(slots=True)
class EndpointStats:
    sent: int = 0
    received: int = 0
    undecodable: int = 0


class LoopbackEndpoint:
    """Duplex link over a non-blocking UDP socket bound to 127.0.0.1."""

    def __init__(self, *, port: int = 0, peer_port: int | None = None) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((LOOPBACK, port))
        self._sock.setblocking(False)
        self.peer: tuple[str, int] | None = (LOOPBACK, peer_port) if peer_port else None
        self.stats = EndpointStats()

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, item: Any) -> None:
        if self.peer is None:
            raise RouteError("endpoint has no peer yet (nothing received, no peer_port given)")
        raw = encode(item)
        if len(raw) > MAX_DATAGRAM:
            raise RouteError(f"envelope of {len(raw)} bytes exceeds one datagram")
        try:
            self._sock.sendto(raw, self.peer)
        except (BlockingIOError, ConnectionRefusedError):
            return  # like a drop on the wire: the pipes re-send
        self.stats.sent += 1

    def receive(self) -> list[Any]:
        out: list[Any] = []
        while True:
            try:
                raw, addr = self._sock.recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, ConnectionRefusedError):
                return out
            if addr[0] != LOOPBACK:
                continue
            if self.peer is None:
                self.peer = (LOOPBACK, int(addr[1]))
            try:
                out.append(decode(raw))
            except CodecError:
                self.stats.undecodable += 1
                continue
            self.stats.received += 1

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> LoopbackEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Selectable(Protocol):
    def fileno(self) -> int: ...


def run_networked(
    sim: Simulation,
    watch: Sequence[Selectable],
    *,
    until: Callable[[], bool],
    max_ticks: int,
    wait: float = 0.002,
) -> bool:
    """Step ``sim`` until ``until()``; between ticks wait for I/O on ``watch`` (≤ ``wait`` s).

    Returns whether ``until()`` became true within ``max_ticks``.
    """
    for _ in range(max_ticks):
        sim.step()
        if until():
            return True
        select.select(list(watch), [], [], wait)
    return False
