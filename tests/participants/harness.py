"""A network of participant instances as real processes, with chaos (SIGKILL, pg_terminate_backend)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from cues_platform.participants.producer import Posting
from tests.support import ROOT

ENTRY = [sys.executable, "-m", "cues_platform.participants.instance"]


@dataclass
class Instance:
    participant: str
    role: str
    name: str
    dsn: str
    slots: int
    log: Path
    proc: subprocess.Popen | None = None
    kills: int = 0

    def start(self, lake: str, env: dict[str, str]) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [*ENTRY, "--id", self.participant, "--role", self.role, "--lake", lake, "--dsn",
             self.dsn, "--instance", f"{self.name}#{self.kills}", "--slots", str(self.slots)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        out.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
            self.kills += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Network:
    lake: str
    dsns: dict[str, str]
    instances: list[Instance] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def start_all(self) -> None:
        for inst in self.instances:
            inst.start(self.lake, self.env)

    def stop_all(self) -> None:
        for inst in self.instances:
            if inst.proc is not None and inst.proc.poll() is None:
                inst.proc.send_signal(signal.SIGTERM)
        for inst in self.instances:
            inst.stop()

    def terminate_backends(self, rng: random.Random, participant: str) -> int:
        """``pg_terminate_backend`` of one random instance session of ``participant``."""
        with psycopg.connect(self.dsns[participant], autocommit=True) as conn:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND "
                "application_name LIKE 'cues-participant:%%' AND pid <> pg_backend_pid()")]
            if not pids:
                return 0
            pid = rng.choice(pids)
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            return 1


def make_postings(sender: str, receivers: list[str], count: int) -> list[Posting]:
    return [Posting(receivers[i % len(receivers)], f"{sender}-{i:06d}",
                    "not json" if i % 11 == 5 else json.dumps({"amount": i, "from": sender}))
            for i in range(count)]


def wait_until(predicate, *, timeout: float, poll: float = 0.25, what: str = "condition"):  # noqa: ANN001, ANN201
    """Bounded poll of ``predicate`` (no fixed sleeps); raises with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def child_env(**settings: object) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["CUES_LOG_LEVEL"] = "WARNING"
    for key, value in settings.items():
        env[f"CUES_PARTICIPANT_{key.upper()}"] = str(value)
    return env
