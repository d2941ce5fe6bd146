"""The supervisor of ``cues participant run``: x instance processes, restarts with backoff, exit code.

Contract of :meth:`Supervisor.run`:

1. Spawn ``count`` instance processes; each one's stderr is forwarded line by line, prefixed with
   ``[instance NAME]``, and its last lines are kept.
2. Poll them. An instance that exits while no stop was requested:
   - with exit code 0 after ``--idle-exit``: it is done;
   - exit code 0 or killed by SIGTERM/SIGINT (stopped by someone else): restarted, not a failure;
   - otherwise it is reported in one line (``instance I (NAME) failed with exit code C: <its last
     error line>``); with restarts on it is restarted after ``restart_delay`` — the backoff doubles
     per consecutive failure up to ``restart_backoff_max`` and starts again from
     ``restart_backoff_initial`` once an instance ran ``restart_healthy_after`` seconds.
3. On :meth:`stop` (SIGTERM/SIGINT): SIGTERM every instance, restart none, wait for all.
4. Return the exit code: ``EXIT_OK`` (0) when every instance ended cleanly (done, or stopped on
   request), ``EXIT_INSTANCE_FAILED`` (4) when an instance failed and was not restarted
   (``--no-restart``), or was still failing when the stop came (waiting for its restart, or
   restarted after a failure less than ``restart_healthy_after`` seconds before).

:func:`one_line_errors` is what an instance process's ``__main__`` runs: an exception becomes one
line on stderr (the traceback too only with ``CUES_DEBUG=1``) and exit code 2 (a ``CuesError``:
bad input or state) or 3 (anything else: a bug), as ``cues`` itself does (``cues_platform/cli/common.py``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO

from cues_platform.errors import CuesError
from cues_platform.oneline import EXIT_BAD_INPUT, EXIT_BUG, bug_hint, debugging, exception_line

EXIT_OK = 0
EXIT_INSTANCE_FAILED = 4  # `run`: an instance failed and was not (or not yet) restarted
TAIL_LINES = 20
POLL = 0.2  # seconds between polls of the instance processes


def restart_delay(failures: int, *, initial: float, cap: float) -> float:
    """Seconds to wait before the restart after ``failures`` consecutive failures (>= 1)."""
    return min(cap, initial * 2 ** max(0, failures - 1))


def one_line_errors(main: Callable[[], int], *, what: str = "instance") -> int:
    """Run ``main()``; an exception is one line on stderr (traceback with ``CUES_DEBUG=1``)."""
    try:
        return main()
    except CuesError as exc:
        line = f"error: {what}: {exception_line(exc)}"
        return _report(exc, line + (" (retryable: restarting may help)" if exc.retryable else ""),
                       EXIT_BAD_INPUT)
    except Exception as exc:  # noqa: BLE001 - the last resort of a process: one line, exit 3
        return _report(exc, f"error: {what}: unexpected {exception_line(exc)} {bug_hint()}", EXIT_BUG)


def _report(exc: BaseException, line: str, code: int) -> int:
    if debugging():
        traceback.print_exception(exc, file=sys.stderr)
    print(line, file=sys.stderr, flush=True)
    return code


@dataclass
class _Child:
    index: int
    name: str = ""
    proc: subprocess.Popen | None = None
    started: float = 0.0
    failures: int = 0  # consecutive failures (reset after a healthy run)
    restart_at: float | None = None  # set while waiting to be restarted
    failing: bool = False  # its last run failed (or it was restarted after a failure and has
    # not yet run healthy_after seconds)
    done: bool = False
    terminated: bool = False  # SIGTERM sent to its current process
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None


class Supervisor:
    """Run ``count`` copies of ``command`` (plus ``--instance NAME``) as in the module contract."""

    def __init__(self, *, command: Sequence[str], env: dict[str, str], count: int, prefix: str,
                 restart: bool, idle_exit: bool, backoff_initial: float, backoff_max: float,
                 healthy_after: float, echo: Callable[[str], None],
                 out: IO[str] | None = None) -> None:
        self.command, self.env, self.prefix = list(command), env, prefix
        self.restart, self.idle_exit = restart, idle_exit
        self.backoff_initial, self.backoff_max = backoff_initial, backoff_max
        self.healthy_after, self.echo = healthy_after, echo
        self.children = [_Child(i) for i in range(count)]
        self.stopping = threading.Event()
        self.failed: list[tuple[str, int]] = []  # (instance name, exit code), every failure
        self._lock = threading.Lock()

    # Step 1
    def _spawn(self, child: _Child) -> None:
        import uuid

        child.name = f"{self.prefix}-{child.index}-{uuid.uuid4().hex[:6]}"
        child.tail.clear()
        child.proc = subprocess.Popen([*self.command, "--instance", child.name], env=self.env,
                                      stderr=subprocess.PIPE, text=True, errors="replace")
        child.started, child.restart_at, child.terminated = time.monotonic(), None, False
        child.reader = threading.Thread(target=self._forward, args=(child, child.proc),
                                        daemon=True, name=f"stderr-{child.name}")
        child.reader.start()

    def _forward(self, child: _Child, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            line = line.rstrip("\n")
            child.tail.append(line)
            with self._lock:
                self.echo(f"[instance {child.name}] {line}")

    def stop(self, *_: object) -> None:
        """Step 3: stop every instance (from any thread; `cues participant run` calls it from
        :class:`~cues_platform.signals.StopSignals`' thread, never inside a signal handler)."""
        self.stopping.set()
        self._terminate()

    def _terminate(self) -> None:
        for child in self.children:
            if child.proc is not None and not child.terminated and child.proc.poll() is None:
                child.terminated = True
                child.proc.send_signal(signal.SIGTERM)

    def _last_error(self, child: _Child) -> str:
        lines = [line for line in child.tail if line.strip()]
        errors = [line for line in lines if line.startswith("error:")]
        return (errors or lines or ["(no output on stderr)"])[-1]

    # Step 2
    def _exited(self, child: _Child, code: int, now: float) -> None:
        if child.reader is not None:
            child.reader.join(timeout=5)  # the rest of its stderr (EOF follows the exit)
        ran = now - child.started
        clean = code in (0, -signal.SIGTERM, -signal.SIGINT)  # ended, or stopped by a signal
        if code == 0 and self.idle_exit:
            child.done, child.failing = True, False
            return
        if clean and self.stopping.is_set():  # still failing if restarted and not yet healthy
            child.done = True
            child.failing = child.failing and ran < self.healthy_after
            return
        if clean:
            self.echo(f"instance {child.index} ({child.name}) exited with code {code}")
        else:
            self.failed.append((child.name, code))
            self.echo(f"instance {child.index} ({child.name}) failed with exit code {code} after "
                      f"{ran:.1f}s: {self._last_error(child)}")
        child.failing = not clean
        if self.stopping.is_set() or not self.restart:
            child.done = True
            return
        child.failures = (0 if ran >= self.healthy_after else child.failures) + 1
        delay = restart_delay(child.failures, initial=self.backoff_initial, cap=self.backoff_max)
        child.restart_at = now + delay
        self.echo(f"instance {child.index}: restarting in {delay:g}s (consecutive failures: "
                  f"{child.failures})")

    def run(self) -> int:
        """Steps 1-4; returns the exit code."""
        for child in self.children:
            self._spawn(child)
        while True:
            now = time.monotonic()
            for child in self.children:
                if child.done:
                    continue
                if child.restart_at is not None:
                    if self.stopping.is_set():
                        child.done = True  # still failing when the stop came
                    elif now >= child.restart_at:
                        self._spawn(child)
                    continue
                assert child.proc is not None
                code = child.proc.poll()
                if code is not None:
                    self._exited(child, code, now)
            if all(child.done for child in self.children):
                break
            if self.stopping.is_set():
                self._terminate()  # also a process spawned while the stop arrived
                time.sleep(POLL)
            else:
                self.stopping.wait(POLL)
        # Step 4
        return EXIT_INSTANCE_FAILED if any(c.failing for c in self.children) else EXIT_OK
