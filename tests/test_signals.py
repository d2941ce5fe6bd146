"""StopSignals: a stop signal that lands while the main thread holds the event's lock is still
delivered, where ``lambda *_: event.set()`` hangs the process for good (cues_platform/signals.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from cues_platform.signals import StopSignals
from tests.support import ROOT

# The main thread holds the event's condition lock (as Event.wait() does on its way in and out)
# when SIGTERM arrives; the handler runs right there, inside the `with`.
LOCK_HELD = """
import os, signal, sys, threading
from cues_platform.signals import StopSignals
event = threading.Event()
{install}
with event._cond:
    signal.raise_signal(signal.SIGTERM)
    print("handler returned", flush=True)
print("delivered" if event.wait(10) else "lost", flush=True)
{uninstall}
"""
NAIVE = ("signal.signal(signal.SIGTERM, lambda *_: event.set())", "")
SAFE = ("stop = StopSignals(lambda _signum: event.set()); stop.__enter__()", "stop.__exit__(None, None, None)")


def _run(install: str, uninstall: str, timeout: float) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(LOCK_HELD).format(install=install, uninstall=uninstall)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_a_handler_that_sets_the_event_hangs_when_the_lock_is_held() -> None:
    """The failure StopSignals exists for: the naive handler never returns (SIGKILL needed)."""
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        _run(*NAIVE, timeout=3)
    assert b"handler returned" not in (caught.value.stdout or b"")


def test_stop_signals_delivers_the_stop_when_the_lock_is_held() -> None:
    proc = _run(*SAFE, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["handler", "returned", "delivered"]


def test_every_signal_is_delivered_before_exit_and_the_previous_handler_comes_back() -> None:
    seen: list[int] = []
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals(seen.append) as stop:
        assert stop.installed and signal.getsignal(signal.SIGTERM) != before
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
        assert stop.received == signal.SIGINT
    assert seen == [signal.SIGTERM, signal.SIGINT]  # drained by __exit__, in order
    assert signal.getsignal(signal.SIGTERM) == before


def test_off_the_main_thread_nothing_is_installed() -> None:
    result: list[bool] = []

    def body() -> None:
        with StopSignals(lambda _s: None) as stop:
            result.append(stop.installed)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert result == [False]


def test_no_module_installs_a_handler_of_its_own() -> None:
    """cues run, the graph runner, the participant supervisor and its instances all go through
    StopSignals: no other module of the package calls signal.signal."""
    offenders = []
    for path in (ROOT / "cues_platform").rglob("*.py"):
        text = path.read_text()
        if "signal.signal(" in text and path.name != "signals.py":
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
