"""Loopback network route: the same pipes over UDP on 127.0.0.1, in one and in two processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cues_platform.pipes import (
    FaultSchedule,
    Outbox,
    Property,
    ResendConfig,
    Route,
    RouteError,
    Simulation,
    check,
)
from cues_platform.pipes.loopback import LOOPBACK, LoopbackEndpoint, run_networked
from cues_platform.pipes.loopback_demo import sender_half
from cues_platform.pipes.messages import Data, Indexed
from cues_platform.pipes.resend import ResendMultiSender, ResendReceiver


def test_endpoints_bind_to_loopback_only_and_learn_their_peer() -> None:
    with LoopbackEndpoint() as a, LoopbackEndpoint(peer_port=a.port) as b:
        assert a._sock.getsockname()[0] == LOOPBACK
        with pytest.raises(RouteError):
            a.send("nobody to send to yet")
        b.send(Data("m/0/1", Indexed(1, "x")))
        sim = Simulation()
        got: list[object] = []
        assert run_networked(
            sim, [a], until=lambda: bool(got.extend(a.receive()) or got), max_ticks=5000
        )
        assert got == [Data("m/0/1", Indexed(1, "x"))]
        assert a.peer == (LOOPBACK, b.port)


def test_resend_multi_workers_over_loopback_in_one_process() -> None:
    with LoopbackEndpoint() as rx, LoopbackEndpoint(peer_port=rx.port) as tx:
        # Each worker uses its own socket as both its forward and its back link.
        sender = ResendMultiSender(name="tx", route=Route(tx, tx), config=ResendConfig(20))
        outbox = Outbox()
        receiver = ResendReceiver(name="rx", route=Route(rx, rx), outbox=outbox)
        sim = Simulation().add(sender, receiver)
        for i in range(50):
            sender.submit(i)
        received: list[int] = []

        def done() -> bool:
            received.extend(outbox.drain())
            return sender.pending == 0

        assert run_networked(sim, [rx, tx], until=done, max_ticks=20_000)
        assert check(Property.AT_LEAST_ONCE, list(range(50)), received) is None


def test_exactly_once_pipe_across_two_processes() -> None:
    """The composed exactly-once pipe, split across this process and a child process, with a
    seeded fault injector dropping, duplicating and reordering on the sender side."""
    child = subprocess.Popen(
        [sys.executable, "-m", "cues_platform.pipes.loopback_demo", "receiver"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        port = json.loads(child.stdout.readline())["port"]
        faults = FaultSchedule(seed=5, drop=0.2, duplicate=0.2, delay=0.3, max_delay=6)
        half = sender_half(peer_port=port, faults=faults)
        with half.endpoint:
            payloads = [f"m{i}" for i in range(60)]
            for p in payloads:
                half.outer.submit(p)
            assert run_networked(
                half.sim,
                [half.endpoint],
                until=lambda: half.inner.pending == 0,
                max_ticks=50_000,
            )
        child.stdin.close()
        report = json.loads(child.stdout.readline())
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    assert report["finished"] is True
    assert report["received"] == payloads
    assert half.inner.resent > 0  # the injected faults did force re-sends across processes
