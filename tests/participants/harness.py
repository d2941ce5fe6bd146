"""A network of participant instances as real processes, with chaos (SIGKILL, SIGSTOP probes,
pg_terminate_backend), and the ``cues participant`` CLI run as a real process.

Everything here observes the network through its public surface: the processes, the CLI, and the
participants' PostgreSQL rows (``messages``, ``audit``, ``leases``, ``received``) -- no imports of
protocol internals beyond ``Posting``. Waits are conditions with deadlines (:func:`wait_until`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from cues_platform.participants.postings import Posting
from tests.support import ROOT

ENTRY = [sys.executable, "-m", "cues_platform.participants.instance"]
CLI = [sys.executable, "-m", "cues_platform.cli", "participant"]


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
    retired: bool = False  # SIGKILLed for good (scale-down): never started again

    @property
    def owner(self) -> str:
        """The instance id the running process uses (its lease owner, its audit instance_id)."""
        return f"{self.name}#{self.kills}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, lake: str, env: dict[str, str]) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [*ENTRY, "--id", self.participant, "--role", self.role, "--lake", lake, "--dsn",
             self.dsn, "--instance", self.owner, "--slots", str(self.slots)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        out.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
            self.kills += 1

    def retire(self) -> None:
        """Scale-down: SIGKILL for good (a lost host); the instance is never started again."""
        self.kill()
        self.retired = True

    def pause(self) -> bool:
        """SIGSTOP (freeze) the process; False if it is not running."""
        if not self.alive:
            return False
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        return True

    def resume(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)

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
    logs: Path | None = None  # where :meth:`add` puts each instance's log

    def start_all(self) -> None:
        for inst in self.instances:
            inst.start(self.lake, self.env)

    def stop_all(self) -> None:
        for inst in self.instances:
            if inst.proc is not None and inst.proc.poll() is None:
                inst.proc.send_signal(signal.SIGCONT)  # a paused one must see its SIGTERM
                inst.proc.send_signal(signal.SIGTERM)
        for inst in self.instances:
            inst.stop()

    def add(self, participant: str, role: str, name: str, *, slots: int = 1,
            start: bool = True) -> Instance:
        """A new instance of ``participant`` (scale-up), started at once unless ``start=False``."""
        assert self.logs is not None, "Network(logs=...) is needed to add instances"
        inst = Instance(participant, role, name, self.dsns[participant], slots,
                        self.logs / f"{name}.log")
        self.instances.append(inst)
        if start:
            inst.start(self.lake, self.env)
        return inst

    def live(self, participant: str) -> list[Instance]:
        return [i for i in self.instances if i.participant == participant and i.alive]

    def restart(self, inst: Instance) -> None:
        """Crash and recover: SIGKILL, then start the same instance again (a new owner id)."""
        inst.kill()
        inst.start(self.lake, self.env)

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """``cues participant ARGS...`` as a real process with the network's environment."""
        return subprocess.run([*CLI, *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def consumer_holder(self, consumer: str) -> Instance | None:
        """The live instance whose consumer lease is current, or None (lease expired/free)."""
        with psycopg.connect(self.dsns[consumer]) as conn:
            row = conn.execute("SELECT owner FROM leases WHERE name = 'consumer' AND "
                               "lease_until > now()").fetchone()
        owner = row[0] if row else None
        return next((i for i in self.live(consumer) if i.owner == owner), None)

    def kill_in_flight(self, inst: Instance, *, timeout: float, feed: Callable[[], object],
                       retire: bool = True) -> int:
        """SIGKILL producer instance ``inst`` at a moment it has assigned postings that POSTINGS
        has not acknowledged yet (its publication is in flight): freeze it (SIGSTOP), look at its
        audit rows, kill it if so, else let it go on. ``feed`` records more postings whenever
        there is nothing left to publish. Returns how many postings it left in flight."""

        def probe() -> int:
            if not inst.pause():
                raise AssertionError(f"{inst.owner} died on its own (see {inst.log})")
            try:
                n = in_flight(self.dsns[inst.participant], inst.owner)
            except BaseException:
                inst.resume()
                raise
            if n:
                if retire:
                    inst.retire()
                else:
                    inst.kill()
                return n
            inst.resume()
            if unassigned(self.dsns[inst.participant]) == 0:
                feed()
            return 0

        return wait_until(probe, timeout=timeout, poll=0.01,
                          what=f"{inst.owner} to have a publication in flight")

    def log_tails(self, lines: int = 15) -> str:
        out = []
        for inst in self.instances:
            if inst.log.exists():
                tail = inst.log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {inst.log.name} (alive={inst.alive}, retired={inst.retired})\n"
                           + "\n".join(tail))
        return "\n".join(out)

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


def make_postings(sender: str, receivers: list[str], count: int, *, start: int = 0
                  ) -> list[Posting]:
    """Postings ``{sender}-{i:06d}`` for i in [start, start + count); every 11th (i % 11 == 5)
    has a payload that is not JSON, so the consumer REJECTS it (:func:`expected_status`)."""
    return [Posting(receivers[i % len(receivers)], f"{sender}-{i:06d}",
                    "not json" if i % 11 == 5 else json.dumps({"amount": i, "from": sender}))
            for i in range(start, start + count)]


def expected_status(message_id: str) -> str:
    """The consumer's verdict on a posting of :func:`make_postings`."""
    return "REJECTED" if int(message_id.rsplit("-", 1)[1]) % 11 == 5 else "OK"


def in_flight(dsn: str, owner: str) -> int:
    """Postings ``owner`` assigned to a publication that POSTINGS has not acknowledged (audit)."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT count(*) FROM audit a WHERE a.action = 'assigned' AND a.instance_id = %s "
            "AND NOT EXISTS (SELECT 1 FROM audit b WHERE b.sender = a.sender AND "
            "b.message_id = a.message_id AND b.action = 'posting_acked')", (owner,)).fetchone()[0]


def unassigned(dsn: str) -> int:
    """Recorded postings no instance has assigned to a publication yet (audit)."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT count(*) FROM messages m WHERE NOT EXISTS (SELECT 1 FROM audit a WHERE "
            "a.sender = m.sender AND a.message_id = m.message_id AND a.action = 'assigned')"
        ).fetchone()[0]


def statuses(dsn: str) -> dict[str, tuple[str, str]]:
    """message id → (ack status, processing status) of a producer's ``messages``."""
    with psycopg.connect(dsn) as conn:
        return {m: (a, p) for m, a, p in conn.execute(
            "SELECT message_id, ack_status, processing_status FROM messages")}


def final_count(dsn: str) -> int:
    """Postings with their result applied (acked_result)."""
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM messages WHERE ack_status = 'acked_result'"
                            ).fetchone()[0]


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
