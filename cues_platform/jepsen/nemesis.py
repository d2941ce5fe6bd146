"""The nemesis: real child processes (runners, feeders) killed at random moments, and
maintenance racing with appends and readers.

Every child is started with ``start_new_session=True`` so it leads its own process group, and is
killed with ``os.killpg``: a runner's Spark JVM is in a process group of its own and exits when
the runner dies (its gateway's stdin closes: ``spark/session.py``).

Kinds of fault (chosen by the seeded random generator; the moments depend on the machine's
speed, so a replay re-runs the same kinds in the same order against the same keys):

- ``kill_by_progress``: SIGKILL (or SIGTERM) the runner once a random number (1-12 per partition)
  of further commits exist (backing records and fences of every lane, and output-queue commits: a
  one-commit step writes only its output queue), so kills land at random protocol
  points (inside a commit, between a fork's commits, in a sink's effect, ...).
- ``kill_in_recovery``: start a runner and SIGKILL it once 1..9 of its ten lanes (five processors,
  two partitions each) have fenced (their backing queue got the new epoch commit): the others
  have not recovered yet.
- ``kill_after_start``: SIGKILL or SIGTERM a runner 0.5-8 s after it started (Spark starting,
  recovery, the first steps).
- ``kill_feeder``: SIGKILL a feeder (idempotent or transactional) mid-stream; it is restarted.
- ``concurrent``: a second runner of the same graph on the same lake until 4-16 further commits
  per partition, then one of the two is killed.
- Maintenance (a thread): compaction, checkpoints and vacuum (retention 1 h) of random queues via
  the Queue maintenance API, and now and then ``cues queue maintain`` as a child process.
- ``redeploy`` (with ``--redeploy``): stop the runner and start the graph under another version
  (``workload.VARIANTS``, ``cues run jepsen_graph.py:graph_<variant>``). Now and then, first an
  incompatible version, but only once the processor it changes has made progress (its first
  output has rows): that start must fail with exit 2 and a ``failed`` event naming the expected
  RedeployError subclass before any lane recovered; a start that recovers a lane (or does not
  decide within :data:`REFUSAL_TIMEOUT`) is a *silent change of meaning*, killed and recorded.
  Then always a compatible version (a different one from the current), which must continue.
  A compatible version whose start is refused with ``StepInFlightError`` (a step recorded under
  the bindings of the version before: a sink records its snapshot before its function) is
  deferred: the runner goes back to a version with the bindings of the one before, which finishes
  the step. Every redeploy is a line of ``redeploys.jsonl`` in the run folder, for the checker.
- A tailer (a thread) reads each partition of ``enriched`` read_committed and commits its
  position there throughout; every row it reads must be the next offset of that partition and a
  key the plan sends to that partition (lane p of ``enrich`` writes partition p only).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from cues_platform.jepsen import workload as w
from cues_platform.queues import Lake
from cues_platform.queues.maintenance import compact, maintain, vacuum
from cues_platform.settings import child_environment

GRAPH_FILE = Path(__file__).resolve().parent / "user" / "jepsen_graph.py"
GRAPH_REF = f"{GRAPH_FILE}:graph"
REFUSAL_TIMEOUT = 300.0  # seconds an incompatible start has to refuse (a Spark start on a busy machine)
LIVE_EVENTS = ("recovered", "step")  # a runner that emitted one of these went past the redeploy check


def graph_ref(variant: str) -> str:
    """The reference ``cues run`` loads for ``variant`` (``workload.VARIANTS``)."""
    return f"{GRAPH_FILE}:{w.VARIANTS[variant].attr}"
# Commit counts of the progress gauge scale with the lanes per processor: a runner's recovery
# alone commits each lane's fences (its backing queue and its output queues: about 20 commits
# with two lanes, 10 with one), so "1-12 more commits" of a one-lane graph is "1-24" here;
# unscaled, every kill by progress of a fresh runner would land inside its recovery.
PER_LANE = len(w.PARTITIONS)


@dataclass
class Child:
    name: str
    kind: str  # "runner" | "feeder"
    proc: subprocess.Popen
    log: Path
    started: float = field(default_factory=time.monotonic)
    variant: str = w.BASE  # the graph version a runner runs

    def events(self) -> list[dict]:
        """The JSON event lines (``cues run --no-progress``) in the child's log so far."""
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            if line.startswith("{") and '"event"' in line:
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def failure(self) -> tuple[str | None, str]:
        """(error_type, error) of the last ``failed`` event of a runner (None: none)."""
        failed = [e for e in self.events() if e.get("event") == "failed"]
        return (failed[-1].get("error_type"), failed[-1].get("error", "")) if failed else (None, "")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def tail(self, chars: int = 1200) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


def spawn(name: str, kind: str, argv: list[str], log: Path) -> Child:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n=== {name}: {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=child_environment({"PYTHONUNBUFFERED": "1"}))
    return Child(name, kind, proc, log)


def backing_versions(lake_root: Path) -> dict[str, int]:
    """Newest Delta version of each lane's backing queue (-1: none yet): a cheap progress
    gauge that counts snapshots, attempts and recovery fences."""
    out = {}
    for pid in w.LANES:
        log = lake_root / "_cues" / "backing" / pid / "_delta_log"
        try:
            names = [n for n in os.listdir(log) if n.endswith(".json") and n[:20].isdigit()]
        except FileNotFoundError:
            names = []
        out[pid] = max((int(n[:20]) for n in names), default=-1)
    return out


def _log_version(folder: Path) -> int:
    try:
        names = [n for n in os.listdir(folder / "_delta_log") if n.endswith(".json") and n[:20].isdigit()]
    except FileNotFoundError:
        names = []
    return max((int(n[:20]) for n in names), default=-1)


def progress(lake_root: Path) -> int:
    """Commits of the backing queues (fences, attempts, a sink's snapshots) and of the processors'
    output queues (one-commit steps write no backing record: their step is their output commit)."""
    outputs = (w.MERGED, w.VALIDATED, w.LEFT, w.RIGHT, w.ENRICHED, w.ERRORS)
    return (sum(v + 1 for v in backing_versions(lake_root).values())
            + sum(_log_version(lake_root / "queues" / q) + 1 for q in outputs))


@dataclass
class Stats:
    kills: Counter = field(default_factory=Counter)
    concurrent_periods: int = 0
    runner_starts: int = 0
    feeder_starts: int = 0
    maintenance_runs: int = 0
    maintenance_errors: list[str] = field(default_factory=list)
    tailer_rows: int = 0
    tailer_errors: list[str] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    expected_exits: Counter = field(default_factory=Counter)
    actions: list[str] = field(default_factory=list)
    # redeploys: "compatible", "incompatible" (attempted), "refused", "not refused", "deferred"
    redeploys: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)  # RedeployError class -> refusals
    silent_changes: list[str] = field(default_factory=list)  # incompatible starts not refused


class Nemesis:
    """Owns the children and the fault schedule of one run."""

    def __init__(self, *, lake_root: Path, run_dir: Path, seed: int, plan: w.Plan,
                 feed_seconds: float, lost_ack_rate: float, resend_in_txn: bool,
                 concurrent: bool = True, redeploy: bool = False,
                 txn_timeout: float | None = None) -> None:
        self.concurrent, self.redeploy = concurrent, redeploy
        self.txn_timeout = txn_timeout  # the txn feeder's timeout (platform seconds; None: default)
        self.variant = self.previous = w.BASE  # the graph version runners start with, and the one before
        self.redeploy_rng = random.Random(f"{seed}/redeploy")
        self.lake_root, self.run_dir, self.plan = lake_root, run_dir, plan
        self.rng = random.Random(f"{seed}/nemesis")
        self.seed = seed
        self.stats = Stats()
        self.runners: list[Child] = []
        self.feeders: dict[str, Child] = {}
        self.done_feeders: set[str] = set()
        self.feeder_fail: Counter = Counter()
        self.lost_ack_rate, self.resend_in_txn = lost_ack_rate, resend_in_txn
        self.paces = {f"idem{f}": feed_seconds / max(1, len(b)) for f, b in enumerate(plan.idem_batches)}
        self.paces["txn"] = feed_seconds / max(1, len(plan.txn_batches))
        self._counter = 0

    # -- children ------------------------------------------------------------------------------
    def _log(self, name: str) -> Path:
        return self.run_dir / "logs" / f"{name}.log"

    def start_runner(self, *, idle_exit: float | None = None, variant: str | None = None) -> Child:
        self._counter += 1
        variant = variant or self.variant
        argv = [sys.executable, "-m", "cues_platform.cli", "run", graph_ref(variant),
                "--lake", str(self.lake_root), "--no-progress"]
        if idle_exit is not None:
            argv += ["--idle-exit", str(idle_exit)]
        child = spawn(f"runner-{self._counter}", "runner", argv, self._log(f"runner-{self._counter}"))
        child.variant = variant
        self.runners.append(child)
        self.stats.runner_starts += 1
        return child

    def start_feeder(self, name: str) -> Child:
        common = ["--lake", str(self.lake_root), "--run-dir", str(self.run_dir), "--seed",
                  str(self.plan.seed), "--keys", str(self.plan.keys), "--pace", f"{self.paces[name]:.4f}"]
        if name == "txn":
            args = ["txn", *common] + (["--resend-in-txn"] if self.resend_in_txn else [])
            args += ["--txn-timeout", f"{self.txn_timeout:g}"] if self.txn_timeout else []
        else:
            args = ["idem", *common, "--index", name.removeprefix("idem"),
                    "--lost-ack-rate", str(self.lost_ack_rate)]
        child = spawn(name, "feeder", [sys.executable, "-m", "cues_platform.jepsen.feeders", *args],
                      self._log(name))
        self.feeders[name] = child
        self.stats.feeder_starts += 1
        return child

    def feeder_names(self) -> list[str]:
        return [f"idem{f}" for f in range(self.plan.idem_feeders)] + ["txn"]

    def tend(self, *, restart_runner: bool = True) -> None:
        """Reap exited children, restart unfinished feeders, keep one runner going."""
        for name in self.feeder_names():
            child = self.feeders.get(name)
            if name in self.done_feeders or (child is not None and child.alive):
                continue
            if child is not None:
                rc = child.proc.returncode
                if rc == 0:
                    self.done_feeders.add(name)
                    continue
                if rc not in (-signal.SIGKILL, -signal.SIGTERM):
                    self.feeder_fail[name] += 1
                    self.stats.unexpected_exits.append(f"feeder {name} exited {rc}: {child.tail(600)}")
                    if self.feeder_fail[name] > 5:
                        raise RuntimeError(f"feeder {name} keeps failing (rc {rc}); see {child.log}")
            self.start_feeder(name)
        for child in list(self.runners):
            if not child.alive:
                self.runners.remove(child)
                self._note_runner_exit(child)
        if restart_runner and not self.runners:
            self.start_runner()

    def _note_runner_exit(self, child: Child) -> None:
        rc = child.proc.returncode
        tail = child.tail(3000)
        if rc in (-signal.SIGKILL, -signal.SIGTERM) or (rc == 0 and getattr(child, "signalled", False)):
            return
        error_type, error = child.failure()
        if rc == 2 and error_type is not None and self._refused_compatible(child, error_type, error):
            return
        if rc == 2 and "fenced" in tail.lower():
            self.stats.expected_exits["runner fenced by a newer runner"] += 1
            return
        if rc == 0 and "stop requested" in tail:
            return
        lines = [ln for ln in tail.splitlines() if ln.strip()]
        self.stats.unexpected_exits.append(f"{child.name} exited {rc}: " + " | ".join(lines[-4:]))

    # -- redeploys -------------------------------------------------------------------------------
    def _record(self, **fields: object) -> None:
        with open(self.run_dir / w.REDEPLOY_LOG, "a") as f:
            f.write(json.dumps(fields, default=str) + "\n")

    def _refused_compatible(self, child: Child, error_type: str, error: str) -> bool:
        """A runner of a compatible version exited 2 with a RedeployError: a step in flight under
        other bindings is deferred (back to a version with the previous bindings); any other
        refusal of a compatible version is recorded for the checker. True when handled."""
        if error_type not in REDEPLOY_ERRORS:
            return False
        if error_type == "StepInFlightError":
            self.stats.redeploys["deferred"] += 1
            self.stats.expected_exits["compatible version deferred: a step in flight"] += 1
            back = recorder_of(error) or (self.previous if self.previous != child.variant else w.BASE)
            self._record(event="deferred", variant=child.variant, back_to=back, runner=child.name,
                         error_type=error_type, error=error[:300])
            self.previous, self.variant = child.variant, back
        else:
            self._record(event="compatible_refused", variant=child.variant, runner=child.name,
                         error_type=error_type, error=error[:300])
            self.stats.unexpected_exits.append(f"{child.name}: compatible version {child.variant} "
                                               f"refused with {error_type}: {error[:200]}")
            self.variant, self.previous = self.previous, child.variant
        return True

    def refusal_certain(self, variant: w.Variant) -> bool:
        """Whether ``variant``'s target made progress (its first output has rows in the partition
        the variant needs, or in any), read from the Delta table with deltalake."""
        from deltalake import DeltaTable

        path = self.lake_root / "queues" / w.FIRST_OUTPUT[variant.target]  # type: ignore[index]
        if not (path / "_delta_log").is_dir():
            return False
        parts = DeltaTable(str(path)).to_pyarrow_table(columns=["_partition"])["_partition"].to_pylist()
        return any(variant.needs_partition in (None, p) for p in parts)

    def await_decision(self, child: Child, deadline: float) -> str:
        """"exited" (it decided), "accepted" (a lane recovered or stepped) or "undecided"."""
        while time.monotonic() < deadline:
            if not child.alive:
                return "exited"
            if any(e.get("event") in LIVE_EVENTS for e in child.events()):
                return "accepted"
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=0.2)
        return "exited" if not child.alive else "undecided"

    def try_incompatible(self, variant: w.Variant) -> None:
        """Start ``variant`` (incompatible): it must be refused with ``variant.refusal``."""
        self.stats.redeploys["incompatible"] += 1
        child = self.start_runner(variant=variant.name)
        self.runners.remove(child)  # not a runner the loop keeps going
        decision = self.await_decision(child, time.monotonic() + REFUSAL_TIMEOUT)
        rc = child.proc.returncode
        error_type, error = child.failure() if decision == "exited" else (None, "")
        if decision == "exited" and rc == 2 and error_type == variant.refusal:
            outcome = "refused"
            self.stats.redeploys["refused"] += 1
            self.stats.refusals[error_type] += 1
        else:
            outcome = "not_refused"
            self.stats.redeploys["not refused"] += 1
            what = (f"{decision} (exit {rc}, {error_type}: {error[:200]})" if decision == "exited"
                    else f"{decision}: {'a lane recovered' if decision == 'accepted' else 'no decision'}")
            self.stats.silent_changes.append(f"{child.name} ran incompatible version {variant.name} "
                                             f"({variant.what}), expected {variant.refusal}: {what}")
            self.kill(child, signal.SIGKILL, "runner SIGKILL (incompatible version not refused)")
        self._record(event="incompatible", variant=variant.name, expected=variant.refusal,
                     outcome=outcome, decision=decision, rc=rc, error_type=error_type,
                     error=error[:300], runner=child.name)

    def redeploy_now(self, until: float, *, incompatible_first: bool = False) -> None:
        """Once the runner took 1-8 steps under its version (or at ``until``, at least 90 s from
        now), stop the runners; maybe
        (``incompatible_first``: always, when one is certain to be refused) try an incompatible
        version; start a compatible one."""
        if self.runners:
            runner, want = self.runners[-1], self.rng.randint(1, 8)
            deadline = max(until, time.monotonic() + 90)  # a Spark start can take a minute here
            while runner.alive and time.monotonic() < deadline and \
                    sum(e.get("event") == "step" for e in runner.events()) < want:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    runner.proc.wait(timeout=0.25)
        for runner in list(self.runners):
            sig, label = self._sig()
            self.kill(runner, sig, f"runner {label} (to redeploy)")
            self.runners.remove(runner)
        eligible = [v for v in w.INCOMPATIBLE if self.refusal_certain(v)]
        if eligible and (self.redeploy_rng.random() < 0.6 or incompatible_first):
            self.try_incompatible(self.redeploy_rng.choice(eligible))
        new = self.redeploy_rng.choice([v.name for v in w.COMPATIBLE if v.name != self.variant])
        self.stats.redeploys["compatible"] += 1
        self._record(event="compatible", variant=new, previous=self.variant)
        self.previous, self.variant = self.variant, new
        self.start_runner()

    def kill(self, child: Child, sig: int, label: str) -> None:
        if not child.alive:
            return
        child.signalled = True  # type: ignore[attr-defined]
        child.signal(sig)
        self.stats.kills[label] += 1
        if sig == signal.SIGTERM:
            try:
                child.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                child.signal(signal.SIGKILL)
                self.stats.kills["sigterm_not_obeyed_in_90s"] += 1
        child.proc.wait(timeout=60)
        child.signal(signal.SIGKILL)  # leftovers of the group (the JVM), if any

    def wait_progress(self, target: int, child: Child, deadline: float) -> None:
        while child.alive and progress(self.lake_root) < target and time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=0.05)

    # -- faults ----------------------------------------------------------------------------------
    def _sig(self) -> tuple[int, str]:
        return (signal.SIGKILL, "SIGKILL") if self.rng.random() < 0.7 else (signal.SIGTERM, "SIGTERM")

    def act(self, until: float) -> None:
        action = self.rng.choices(
            ["kill_by_progress", "kill_in_recovery", "kill_after_start", "kill_feeder", "concurrent",
             "redeploy"],  # a zero weight last leaves the choices of a run without it unchanged
            weights=[4, 2, 1, 2, 1 if self.concurrent else 0, 3 if self.redeploy else 0])[0]
        self.stats.actions.append(action)
        runner = self.runners[-1]
        if action == "kill_by_progress":
            self.wait_progress(progress(self.lake_root) + self.rng.randint(1, 12 * PER_LANE), runner,
                               min(until, time.monotonic() + 60))
            sig, label = self._sig()
            self.kill(runner, sig, f"runner {label} by progress")
        elif action == "kill_in_recovery":
            self.kill(runner, signal.SIGKILL, "runner SIGKILL (to restart)")
            before = backing_versions(self.lake_root)
            fresh = self.start_runner()
            want = self.rng.randint(1, len(w.LANES) - 1)
            deadline = min(until + 30, time.monotonic() + 90)
            while fresh.alive and time.monotonic() < deadline:
                now = backing_versions(self.lake_root)
                if sum(now[p] > before[p] for p in now) >= want:
                    break
                with contextlib.suppress(subprocess.TimeoutExpired):
                    fresh.proc.wait(timeout=0.02)
            self.kill(fresh, signal.SIGKILL, "runner SIGKILL inside recovery")
        elif action == "kill_after_start":
            self.kill(runner, signal.SIGKILL, "runner SIGKILL (to restart)")
            fresh = self.start_runner()
            with contextlib.suppress(subprocess.TimeoutExpired):
                fresh.proc.wait(timeout=self.rng.uniform(0.5, 8.0))
            sig, label = self._sig()
            self.kill(fresh, sig, f"runner {label} right after start")
        elif action == "kill_feeder":
            alive = [c for n, c in sorted(self.feeders.items()) if c.alive]
            if not alive:
                return
            victim = self.rng.choice(alive)
            with contextlib.suppress(subprocess.TimeoutExpired):
                victim.proc.wait(timeout=self.rng.uniform(0.0, 2.0))
            self.kill(victim, signal.SIGKILL, f"feeder SIGKILL ({'txn' if victim.name == 'txn' else 'idempotent'})")
        elif action == "concurrent":
            second = self.start_runner()
            self.stats.concurrent_periods += 1
            target = progress(self.lake_root) + self.rng.randint(4 * PER_LANE, 16 * PER_LANE)
            deadline = min(until + 30, time.monotonic() + 60)
            while (runner.alive or second.alive) and progress(self.lake_root) < target \
                    and time.monotonic() < deadline:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    second.proc.wait(timeout=0.05)
            victim = self.rng.choice([runner, second])
            sig, label = self._sig()
            self.kill(victim, sig, f"runner {label} during a concurrent period")
        elif action == "redeploy":
            self.redeploy_now(until)

    def stop_all(self) -> None:
        for child in [*self.runners, *self.feeders.values()]:
            if child.alive:
                child.signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=30)


def recorder_of(error: str) -> str | None:
    """The compatible version whose bindings began the step a StepInFlightError names
    ("processor 'store.1' recorded step ... reading [(binding, queue, partition), ...]; it now
    reads ..."); None when the message cannot be read that way."""
    found = re.search(r"processor '([^']+)' recorded step .*? reading (\[.*?\]); it now reads", error)
    if not found:
        return None
    try:
        began = tuple(sorted(b for b, _, _ in ast.literal_eval(found.group(2))))
    except (ValueError, SyntaxError, TypeError):
        return None
    family = w.lane_family(found.group(1))
    return next((v.name for v in w.COMPATIBLE if w.bindings_of(v.name).get(family) == began), None)


REDEPLOY_ERRORS = ("RedeployError", "LaneMigrationError", "StrategyChangedError", "HomeChangedError",
                   "ProcessorRenamedError", "StepInFlightError")  # processing/errors.py, by class name


class Background:
    """Maintenance and a tailer racing with everything else, in threads, until ``stop``."""

    def __init__(self, *, lake_root: Path, seed: int, stats: Stats, log: Path,
                 plan: w.Plan, maintain: bool = True) -> None:
        self.lake_root, self.stats, self.log, self.plan = lake_root, stats, log, plan
        self.rng = random.Random(f"{seed}/maintenance")
        self.stop = threading.Event()
        # the time nemesis maintains at default settings itself (timewarp.py): maintain=False
        self.threads = [threading.Thread(target=self._tail, name="jepsen-tailer", daemon=True)]
        if maintain:
            self.threads.insert(0, threading.Thread(target=self._maintain, name="jepsen-maintenance",
                                                    daemon=True))

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            if t.ident is not None:  # started
                t.join(timeout=300)

    def _maintain(self) -> None:
        lake = Lake(root=str(self.lake_root))
        queues = [w.SRC_IDEM, w.SRC_TXN, w.MERGED, w.VALIDATED, w.LEFT, w.RIGHT, w.ENRICHED, w.ERRORS]
        while not self.stop.wait(self.rng.uniform(0.5, 4.0)):
            name = self.rng.choice(queues)
            how = self.rng.choice(["maintain", "compact", "vacuum", "cli"])
            try:
                if how == "cli":
                    proc = subprocess.run(
                        [sys.executable, "-m", "cues_platform.cli", "queue", "maintain", name,
                         "--retention-hours", "1", "--lake", str(self.lake_root)],
                        capture_output=True, text=True, timeout=300)
                    if proc.returncode != 0:
                        raise RuntimeError(f"cues queue maintain exited {proc.returncode}: {proc.stderr[-500:]}")
                else:
                    queue = lake.queue(name)
                    if how == "maintain":
                        maintain(queue, retention_hours=1.0)
                    elif how == "compact":
                        compact(queue)
                    else:
                        vacuum(queue, retention_hours=1.0)
                self.stats.maintenance_runs += 1
            except Exception as exc:  # noqa: BLE001 - every failure is reported, none is hidden
                self.stats.maintenance_errors.append(f"{how} {name}: {type(exc).__name__}: {exc}"[:400])

    def _tail(self) -> None:
        lake = Lake(root=str(self.lake_root))
        tailers: dict = {}  # partition -> its Tailer (one name, a position per partition)
        expected = self.plan.partition_of
        while not self.stop.wait(0.2):
            for part in w.PARTITIONS:
                try:
                    tailer = tailers.get(part)
                    if tailer is None:
                        if not lake.has_queue(w.ENRICHED):
                            continue
                        tailer = tailers[part] = lake.queue(w.ENRICHED).tailer("jepsen-tailer",
                                                                                partition=part)
                    position = tailer.position
                    rows = tailer.read_arrow(max_messages=500)
                    offsets = rows["_offset"].to_pylist()
                    where = f"tailer of {w.ENRICHED}/{part}"
                    if offsets and offsets != list(range(position, position + len(offsets))):
                        self.stats.tailer_errors.append(
                            f"{where} read offsets {offsets[:3]}..{offsets[-3:]} from position {position}")
                    stray = [k for k in rows["key"].to_pylist() if expected.get(k) != part]
                    if stray:
                        self.stats.tailer_errors.append(
                            f"{where} read {len(stray)} key(s) the feeders sent to another partition "
                            f"(or never): {', '.join(f'{k} ({expected.get(k)})' for k in stray[:3])}")
                    if offsets:
                        tailer.commit()
                        self.stats.tailer_rows += len(offsets)
                except Exception as exc:  # noqa: BLE001 - reported, never hidden
                    self.stats.tailer_errors.append(f"{w.ENRICHED}/{part}: {type(exc).__name__}: {exc}"[:400])
                    tailers.pop(part, None)
