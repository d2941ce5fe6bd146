"""Spark daemons as processes: start one through pyspark's ``bin/spark-class``, follow its log,
stop it by PID.

Each daemon runs in a session of its own (its process group is its PID), so stopping it also ends
the executors a worker launched. A PID is only signalled while its command line still names the
cluster folder (``-Dcues.cluster=FOLDER``): a stale state file never kills a process that reused
the PID.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from cues_platform.errors import CuesError

SPARK_HOME = Path(importlib.util.find_spec("pyspark").origin or "pyspark/__init__.py").parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
KILL_WAIT = 30.0  # the longest a SIGKILLed daemon may take to be gone
POLL = 0.1  # seconds between two looks at a log or the master's JSON (polling, not a fixed wait)

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}  # daemons this process started: reaped on stop


class ClusterError(CuesError):
    """A standalone Spark cluster could not be started, found or stopped."""


class DaemonStartError(ClusterError):
    """A Master or Worker exited or never became ready; the message names its log."""


def spawn(*, argv: list[str], env: Mapping[str, str], log: Path) -> int:
    """Start ``spark-class ARGV`` in a new session with stdout and stderr to ``log``; its PID."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen([str(SPARK_CLASS), *argv], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=dict(env), start_new_session=True)
    _CHILDREN[proc.pid] = proc
    return proc.pid


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a child of this process that exited is reaped, not a zombie)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def is_ours(pid: int, *, marker: str) -> bool:
    """True when ``pid`` runs and its command line holds ``marker`` (where /proc exists)."""
    if not alive(pid):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.parent.exists():
        return True
    try:
        return marker in cmdline.read_bytes().decode(errors="replace")
    except OSError:
        return False


def daemon_marker(folder: str | Path) -> str:
    """The JVM option that names the cluster folder in each daemon's command line."""
    return f"-Dcues.cluster={Path(folder).resolve()}"


def daemon_alive(pid: int, *, folder: str | Path) -> bool:
    return is_ours(pid, marker=daemon_marker(folder))


def wait_for_line(*, pid: int, log: Path, pattern: str, role: str, deadline: float,
                  on_exit: Callable[[str], CuesError] | None = None) -> re.Match[str]:
    """Poll ``log`` until ``pattern`` matches; a daemon that exits or a deadline that passes is a
    :class:`DaemonStartError` naming ``role`` and the log (or what ``on_exit`` makes of the log)."""
    regex = re.compile(pattern)
    while True:
        text = log.read_text(errors="replace") if log.exists() else ""
        match = regex.search(text)
        if match:
            return match
        if not alive(pid):
            if on_exit is not None:
                raise on_exit(text)
            raise DaemonStartError(
                f"the Spark {role} exited while starting: see its log {log} (last line: "
                f"{last_line(text)!r}); fix what it says and start the cluster again",
                role=role, log=str(log))
        if time.monotonic() > deadline:
            raise DaemonStartError(
                f"the Spark {role} did not log {pattern!r} in time: see its log {log}; on a busy "
                "machine allow more time (--timeout)", role=role, log=str(log))
        time.sleep(POLL)


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("\t")]
    return lines[-1].strip()[:300] if lines else ""


def stop_pids(pids: list[int], *, marker: str, grace: float) -> list[int]:
    """SIGTERM each of ``pids`` that is ours, SIGKILL what still runs after ``grace`` seconds, then
    SIGKILL what is left of their process groups (a worker's executors), and wait until the
    kernel has ended them (a SIGKILL is delivered at once but a big JVM takes a moment to die).
    The PIDs signalled; one still running ``KILL_WAIT`` seconds after its SIGKILL is a
    :class:`ClusterError`."""
    ours = [pid for pid in pids if is_ours(pid, marker=marker)]
    for pid in ours:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(pid) for pid in ours) and time.monotonic() < deadline:
        time.sleep(POLL)
    for pid in ours:
        if alive(pid):
            _signal(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # the daemon's own group: executors it launched
    for pid in ours:
        child = _CHILDREN.pop(pid, None)
        if child is not None:
            child.wait()
    deadline = time.monotonic() + KILL_WAIT
    while (left := [pid for pid in ours if alive(pid) or group_alive(pid)]) and time.monotonic() < deadline:
        time.sleep(POLL)
    if left:
        raise ClusterError(
            f"process(es) {', '.join(map(str, left))} still run {KILL_WAIT:.0f} s after SIGKILL "
            "(stuck in the kernel, e.g. on a hung file system): look at them with `ps -o pid,stat,"
            "wchan -p PID` and stop them by hand", pids=left)
    return ours


def group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` runs (zombies aside); False where /proc is missing."""
    proc = Path("/proc")
    if not proc.is_dir():
        return False
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it ended while we looked
        if fields[0] != "Z" and fields[2] == str(pgid):
            return True
    return False


def kill_group(pid: int) -> None:
    """SIGKILL a daemon and every process of its group at once, as a machine that dies does."""
    os.killpg(pid, signal.SIGKILL)
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        child.wait()


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
