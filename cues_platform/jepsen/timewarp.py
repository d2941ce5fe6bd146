"""The time nemesis (``--time``): a year of the platform clock in ``--duration`` seconds.

The harness sets ``CUES_CLOCK_FILE`` (``cues_platform/clock.py``) before starting anything, so
every child (runners, feeders, ``cues queue maintain``) and the harness itself read one shared
clock offset, which the clock driver moves so that the platform clock runs ``365 days /
duration`` (days per second) until the year is over; then it runs at real speed again.

While the year passes, on top of the usual faults (``nemesis.py``: SIGKILLed runners and feeders,
lost acknowledgements, concurrent runners):

- every key queue and ``ephemeral`` keep 7 days (:data:`RETENTION_MS`, ``cues.retention.ms``);
  the outputs the checker takes as truth keep every row (no policy: ``errors``, ``monthly_out``;
  the sink is a plain Delta table). Maintenance runs at default settings
  (``processing.retention.maintain_queue``: abort overdue transactions, digest, retention,
  compaction, checkpoint, vacuum with its 24 h real retention), round robin over the queues, and
  now and then as ``cues queue maintain NAME`` with no option;
- a lane that steps once a month: ``cues run jepsen_graph.py:monthly`` (processor ``monthly``,
  two lanes, reading ``enriched``) is resumed (SIGCONT) at each month's start until it caught up
  with ``enriched`` as it was then, and paused (SIGSTOP) in between: it holds enriched's low-water
  mark a month behind;
- a lagging tailer (``lagging``, not expendable) on both partitions of ``merged``, registered
  (position 0 committed) before the year starts, reads what is there every 10 days and records
  every ``(partition, offset, key)`` it read (``workload.LAGGING_LOG``) before committing: the
  checker proves merged's retained-away rows by it; an expendable tailer (``expendable``) on
  ``src_a`` reads 20 rows every 60 days and is moved forward by retention
  (``Tailer.retained_away``);
- short-lived producers: a new producer id appends to ``ephemeral`` every day (365 ids a year);
  that queue's ``delta.setTransactionRetentionDuration`` is :data:`EPHEMERAL_TXN_RETENTION`,
  a short *real* interval, because delta-rs expires app transactions by the real clock;
- each quarter a transactional producer (``jepsen-dead-N``) opens a transaction on ``src_t``
  partition "0", is SIGKILLed and never comes back; a read_committed tailer (``dead-watch``)
  reads that partition every 50 ms and records when it was stopped at the dead transaction's
  first offset and when it passed it;
- at each month's start the footprint of every queue is recorded (live bytes, removed bytes still
  on disk, ``_delta_log`` entries, checkpoint size): the checker bounds the year's end by the
  steady state of months 2-3 (``checker.check_time``).

Everything is a JSON line of ``time.jsonl`` in the run folder (``workload.TIME_LOG``); the checker
reads it with the runners' event logs.
"""

from __future__ import annotations

import contextlib
import json
import queue as queue_mod
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from cues_platform import clock
from cues_platform.jepsen import workload as w
from cues_platform.jepsen.lakeread import footprint
from cues_platform.jepsen.nemesis import GRAPH_FILE, Child, Nemesis, spawn
from cues_platform.processing.loader import load_graph
from cues_platform.processing.retention import maintain_queue
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from cues_platform.queues.retention import set_policy
from cues_platform.settings import export

DAY_S = 86_400
DAY_MS = DAY_S * 1000
YEAR_S = 365 * DAY_S
MONTH_S = YEAR_S / 12
RETENTION_MS = 7 * DAY_MS
EPHEMERAL_TXN_RETENTION = "interval 20 seconds"
MONTHLY_REF = f"{GRAPH_FILE}:monthly"
RETAINED_QUEUES = (*w.KEY_QUEUES, w.EPHEMERAL)
# The outputs the checker treats as truth keep every row (no policy): the error queue (the
# rejected keys' record) and monthly_out (every key of enriched, once); the progress queue is the
# transactional feeder's own bookkeeping. Maintenance runs on them too (compaction, checkpoint,
# vacuum), only retention has nothing to do.
UNRETAINED_QUEUES = (w.ERRORS, w.MONTHLY_OUT, w.TXN_PROGRESS)
MAINTAINED_QUEUES = (*RETAINED_QUEUES, w.ERRORS, w.MONTHLY_OUT)
FOOTPRINT_QUEUES = (*RETAINED_QUEUES, *UNRETAINED_QUEUES)
# the platform's own tables every read_committed read and every tailer commit touch: sampled too
INTERNAL_TABLES = ("_cues/transactions", "_cues/positions")
LAGGING_EVERY_DAYS = 10
EXPENDABLE_EVERY_DAYS = 60
EXPENDABLE_READ = 20
DEAD_EVERY_MONTHS = 3
DEAD_TIMEOUT_REAL_S = 3.0  # a dead transaction's timeout, in real seconds of the run
TXN_TIMEOUT_REAL_S = 60.0  # the txn feeder's timeout, in real seconds of the run
WATCH_READ = 500
MONTHLY_BURST_S = 120.0  # the most real seconds a monthly burst may take before it is paused
FINAL_BURST_S = 300.0  # the most real seconds the last burst (after the drain) may take


def rate_of(year_seconds: float) -> float:
    """Platform seconds per real second when a year lasts ``year_seconds``."""
    return YEAR_S / year_seconds


def setup_time(lake_root: Path) -> None:
    """The monthly graph's queues, ``ephemeral``, and the retention policies."""
    lake = Lake(root=str(lake_root))
    create_queues(load_graph(MONTHLY_REF), lake)
    lake.create_queue(w.EPHEMERAL, schema=w.PAYLOAD, partitions=(w.PROGRESS_PARTITION,), exist_ok=True)
    for name in RETAINED_QUEUES:
        set_policy(lake.queue(name), ms=RETENTION_MS, bytes=None)
    lake.queue(w.EPHEMERAL).refresh().alter.set_table_properties(
        {"delta.setTransactionRetentionDuration": EPHEMERAL_TXN_RETENTION}, raise_if_not_exists=False)


class TimeNemesis:
    """The clock driver and the year's actors (threads of the harness, plus child processes)."""

    def __init__(self, *, lake_root: Path, run_dir: Path, seed: int, year_seconds: float,
                 nemesis: Nemesis) -> None:
        self.lake_root, self.run_dir, self.nemesis = lake_root, run_dir, nemesis
        self.year_seconds, self.rate = year_seconds, rate_of(year_seconds)
        self.rng = random.Random(f"{seed}/time")
        self.stats = nemesis.stats
        self.stop = threading.Event()
        self.year_over = threading.Event()
        self._lock = threading.Lock()
        self.months: queue_mod.Queue[int | None] = queue_mod.Queue()  # -> samples, dead txns
        self.bursts: queue_mod.Queue[int | None] = queue_mod.Queue()  # -> the monthly lane
        self.monthly: Child | None = None
        self.monthly_runs = 0
        self.dead: dict[int, Child] = {}
        self.counts = {"ephemeral_producers": 0, "lagging_reads": 0, "expendable_reads": 0,
                       "expendable_retained_away": 0, "watch_reads": 0, "retention_moves": 0,
                       "maintenance_retries": 0, "monthly_bursts": 0, "dead_txns": 0}
        self.violations: list[str] = []
        self.threads: list[threading.Thread] = []
        self.t0 = 0.0
        self.real0_ms = 0

    # -- records -----------------------------------------------------------------------------
    def record(self, **fields: object) -> None:
        with self._lock, open(self.run_dir / w.TIME_LOG, "a") as f:
            f.write(json.dumps(fields, default=str) + "\n")

    def days(self, n: float) -> float:
        """Real seconds of ``n`` platform days."""
        return n * DAY_S / self.rate

    # -- the monthly lane --------------------------------------------------------------------
    def start_monthly(self) -> Child:
        self.monthly_runs += 1
        name = f"monthly-{self.monthly_runs}"
        argv = [sys.executable, "-m", "cues_platform.cli", "run", MONTHLY_REF,
                "--lake", str(self.lake_root), "--no-progress"]
        self.monthly = spawn(name, "runner", argv, self.run_dir / "logs" / f"{name}.log")
        return self.monthly

    def _count(self, event: str) -> int:
        return 0 if self.monthly is None else sum(e.get("event") == event for e in self.monthly.events())

    def _idle_count(self) -> int:
        return self._count("idle")

    def _ends(self, name: str) -> dict[str, int]:
        q = Lake(root=str(self.lake_root)).queue(name)
        return {p: q.next_offset(p) for p in w.PARTITIONS}

    def burst(self, deadline: float) -> bool:
        """Resume the monthly runner until it caught up with ``enriched`` as it is at the burst's
        start (``monthly_out``, a passthrough of it partition by partition, holds as many rows)
        or ``deadline``; pause it. A runner that died is restarted (its recovery is then part of
        the burst). True when it caught up."""
        assert self.monthly is not None
        if not self.monthly.alive:
            self.start_monthly()
        target = self._ends(w.ENRICHED)
        self.monthly.signal(signal.SIGCONT)
        ok = False
        while time.monotonic() < deadline:
            done = self._ends(w.MONTHLY_OUT)
            if all(done[p] >= target[p] for p in target):
                ok = True
                break
            if not self.monthly.alive:
                self.start_monthly()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.monthly.proc.wait(timeout=0.2)
        if self.monthly.alive:
            self.monthly.signal(signal.SIGSTOP)
        return ok

    def register_graph(self, deadline: float) -> None:
        """Before the year starts: a runner of the graph recovers every lane (each lane registers
        in ``_cues/deployments`` and so holds its inputs' low-water marks from offset 0: a lane
        that registers only after retention ran finds its first offsets gone, by design), the
        monthly lane does the same, and the feeders start; the clock starts once the graph's
        runner took its first step (Spark's first job, 20-40 s on two busy cores, is behind it),
        so the first months' step times are the platform's, not Spark's warm-up. The runner and
        the feeders go on into the year."""
        runner = self.nemesis.start_runner()
        self.nemesis.tend()  # the feeders
        self.register_monthly(deadline)
        while time.monotonic() < deadline and runner.alive:
            self.nemesis.tend(restart_runner=False)
            if any(e.get("event") == "step" for e in runner.events()):
                return
            with contextlib.suppress(subprocess.TimeoutExpired):
                runner.proc.wait(timeout=0.2)
        raise RuntimeError(f"the graph's runner took no step before the year: {runner.tail(1500)}")

    def register_monthly(self, deadline: float) -> None:
        """Start the monthly runner and wait until its lanes recovered and it went idle (so the
        registry holds its lanes before retention runs), then pause it."""
        self.start_monthly()
        assert self.monthly is not None
        while time.monotonic() < deadline and self.monthly.alive:
            if self._idle_count() > 0:
                self.monthly.signal(signal.SIGSTOP)
                return
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.monthly.proc.wait(timeout=0.2)
        raise RuntimeError(f"the monthly runner did not become idle: {self.monthly.tail(1500)}")

    # -- threads ---------------------------------------------------------------------------------
    def register_lagging(self) -> None:
        """The lagging tailer commits its position (0) before the year starts: from then on it
        holds merged's low-water mark, so retention never removes a row it has not read."""
        self.lagging = self._tailers(w.MERGED, "lagging", expendable=False)
        for t in self.lagging.values():
            t.commit()

    def start(self) -> None:
        self.register_lagging()
        self.t0 = time.monotonic()
        self.real0_ms = time.time_ns() // 1_000_000
        self.record(event="clock_start", real0_ms=self.real0_ms, platform0_ms=clock.now_ms(),
                    rate=self.rate, year_seconds=self.year_seconds, retention_ms=RETENTION_MS,
                    dead_timeout_s=DEAD_TIMEOUT_REAL_S * self.rate,
                    txn_timeout_s=TXN_TIMEOUT_REAL_S * self.rate)
        for target in (self._drive, self._month_actor, self._burster, self._ephemeral, self._lagging,
                       self._expendable, self._watch, self._maintain):
            t = threading.Thread(target=self._guard(target), name=f"time-{target.__name__}", daemon=True)
            t.start()
            self.threads.append(t)

    def _guard(self, target):
        def run() -> None:
            try:
                target()
            except Exception as exc:  # noqa: BLE001 - reported as a violation, never hidden
                self.violations.append(f"{target.__name__} thread failed: {type(exc).__name__}: {exc}"[:500])
        return run

    def _drive(self) -> None:
        """Move the shared clock offset so platform time runs ``rate`` x real time for the year;
        announce each month's start (and the year's end, month 12)."""
        month = 0
        self.months.put(0)
        self.bursts.put(0)
        while not self.stop.is_set():
            elapsed = min(time.monotonic() - self.t0, self.year_seconds)
            target_ms = round(elapsed * (self.rate - 1) * 1000)
            delta = target_ms - clock.offset_ms()
            if delta > 0:
                clock.advance(seconds=delta / 1000)
            now_month = int(elapsed * self.rate // MONTH_S) if elapsed < self.year_seconds else 12
            while month < now_month:
                month += 1
                self.months.put(month)
                self.bursts.put(month)
            if elapsed >= self.year_seconds:
                self.year_over.set()
                self.months.put(None)
                self.bursts.put(None)
                return
            self.stop.wait(0.05)

    def _month_actor(self) -> None:
        while True:
            month = self.months.get()
            if month is None or self.stop.is_set():
                return
            self.sample(month)
            if month < 12 and month % DEAD_EVERY_MONTHS == 1:
                self.kill_a_transaction_for_good(month // DEAD_EVERY_MONTHS)

    def _burster(self) -> None:
        """One burst of the monthly lane a month (months that passed during a long burst are one)."""
        while True:
            month = self.bursts.get()
            while month is not None and not self.bursts.empty():
                month = self.bursts.get()
            if month is None or month == 12 or self.stop.is_set():
                return
            self.counts["monthly_bursts"] += 1
            started = time.monotonic()
            # the usual SIGKILL, now and then, in the middle of a burst
            if self.rng.random() < 0.25 and self.monthly is not None:
                self.monthly.signal(signal.SIGCONT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.monthly.proc.wait(timeout=self.rng.uniform(0.2, 2.0))
                self.nemesis.kill(self.monthly, signal.SIGKILL, "monthly runner SIGKILL")
            ok = self.burst(time.monotonic() + MONTHLY_BURST_S)
            self.record(event="monthly_burst", month=month, ok=ok,
                        seconds=round(time.monotonic() - started, 3),
                        runner=self.monthly.name if self.monthly else None)

    def sample(self, month: int) -> None:
        out = {}
        for name in (*FOOTPRINT_QUEUES, *INTERNAL_TABLES):
            path = self.lake_root / ("" if name.startswith("_cues/") else "queues") / name
            try:
                out[name] = footprint(path)
            except Exception as exc:  # noqa: BLE001 - a table mid-commit: reported, sampled again
                out[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        self.record(event="footprint", month=month, platform_ms=clock.now_ms(), queues=out)

    def kill_a_transaction_for_good(self, index: int) -> None:
        timeout = DEAD_TIMEOUT_REAL_S * self.rate
        argv = [sys.executable, "-m", "cues_platform.jepsen.feeders", "dead", "--lake", str(self.lake_root),
                "--run-dir", str(self.run_dir), "--seed", "0", "--keys", "0", "--index", str(index),
                "--txn-timeout", f"{timeout:g}"]
        child = spawn(f"dead-{index}", "feeder", argv, self.run_dir / "logs" / f"dead-{index}.log")
        self.dead[index] = child
        marker = self.run_dir / f"dead-{index}.json"
        deadline = time.monotonic() + 120
        while not marker.exists() and child.alive and time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=0.05)
        self.nemesis.kill(child, signal.SIGKILL, "dead transactional producer SIGKILL (for good)")
        if marker.exists():
            self.counts["dead_txns"] += 1
            self.record(**json.loads(marker.read_text()))
        else:
            self.violations.append(f"dead producer {index} never opened its transaction: {child.tail(800)}")

    def _ephemeral(self) -> None:
        q = Lake(root=str(self.lake_root)).queue(w.EPHEMERAL)
        n = 0  # producer n appends at day n + 1 of the year (scheduled on the year's start, so slow sends do not drift)
        while not self.year_over.is_set() and not self.stop.wait(max(0.0, self.t0 + self.days(n + 1) - time.monotonic())):
            keys = [f"e-{n:05d}-{j}" for j in range(3)]
            q.producer(producer_id=f"eph-{n:05d}").send(w.batch_table(keys), partition=w.PROGRESS_PARTITION,
                                                       sequence=0)
            n += 1
            self.counts["ephemeral_producers"] = n

    def _tailers(self, queue_name: str, name: str, *, expendable: bool) -> dict:
        q = Lake(root=str(self.lake_root)).queue(queue_name)
        return {p: q.tailer(name, partition=p, expendable=expendable) for p in w.PARTITIONS}

    def catch_up_lagging(self, tailers: dict) -> None:
        for part, t in tailers.items():
            while True:
                before = t.position
                try:
                    rows = t.read_arrow(max_messages=WATCH_READ)
                except Exception as exc:  # noqa: BLE001 - a reader refused rows it needs: a violation
                    self.violations.append(f"lagging tailer on {w.MERGED}/{part} at {before}: "
                                           f"{type(exc).__name__}: {exc}"[:400])
                    return
                offsets = rows["_offset"].to_pylist()
                if offsets:  # recorded before the commit: the checker proves merged's retained rows by it
                    with self._lock, open(self.run_dir / w.LAGGING_LOG, "a") as f:
                        f.writelines(json.dumps([part, o, k]) + "\n"
                                     for o, k in zip(offsets, rows["key"].to_pylist(), strict=True))
                if offsets != list(range(before, before + len(offsets))) or t.position != before + len(offsets):
                    self.violations.append(f"lagging tailer on {w.MERGED}/{part} read offsets "
                                           f"{offsets[:3]}..{offsets[-3:]} from {before} (to {t.position}): "
                                           "rows it still needed are gone")
                self.counts["lagging_reads"] += len(offsets)
                if not offsets:
                    break
                t.commit()

    def _lagging(self) -> None:
        tailers = self.lagging
        while not self.stop.wait(self.days(LAGGING_EVERY_DAYS)):
            self.catch_up_lagging(tailers)

    def _expendable(self) -> None:
        tailers = self._tailers(w.SRC_IDEM, "expendable", expendable=True)
        self.expendable = tailers
        while not self.stop.wait(self.days(EXPENDABLE_EVERY_DAYS)):
            self.read_expendable(tailers)

    def read_expendable(self, tailers: dict) -> None:
        for t in tailers.values():
            rows = t.read_arrow(max_messages=EXPENDABLE_READ)
            self.counts["expendable_reads"] += rows.num_rows
            t.commit()
        self.counts["expendable_retained_away"] = sum(t.retained_away for t in tailers.values())

    def _watch(self) -> None:
        """Read src_t partition "0" read_committed every 50 ms; record when the reader stood at a
        dead transaction's first offset (stalled) and when it first passed it."""
        q = Lake(root=str(self.lake_root)).queue(w.SRC_TXN)
        t = q.tailer("dead-watch", partition=w.DEAD_PARTITION)
        dead: dict[int, dict] = {}
        seen: dict[int, dict] = {}
        while not self.stop.wait(0.05):
            for path in self.run_dir.glob("dead-*.json"):
                index = int(path.stem.split("-")[1])
                if index not in dead:
                    dead[index] = json.loads(path.read_text())
            at = clock.now_ms()
            before = t.position
            rows = t.read_arrow(max_messages=WATCH_READ)
            end = q.next_offset(w.DEAD_PARTITION)
            self.counts["watch_reads"] += 1
            for index, d in dead.items():
                s = seen.setdefault(index, {"stalled": 0, "first_stall_ms": None, "last_stall_ms": None,
                                            "passed_ms": None, "passed_read_ms": None})
                if t.position == d["first"] and rows.num_rows < WATCH_READ and end > d["end"]:
                    s["stalled"] += 1
                    s["first_stall_ms"] = s["first_stall_ms"] or at
                    s["last_stall_ms"] = at
                if s["passed_ms"] is None and before <= d["first"] < t.position:
                    s["passed_ms"] = at
                    s["passed_read_ms"] = clock.now_ms()
            if rows.num_rows:
                t.commit()
            self.watch = seen

    def _maintain(self) -> None:
        """Maintenance at default settings, round robin over every retained queue."""
        lake = Lake(root=str(self.lake_root))
        order = list(MAINTAINED_QUEUES)
        i = 0
        while not self.stop.wait(0.2):
            name = order[i % len(order)]
            i += 1
            try:
                if self.rng.random() < 0.15:
                    proc = subprocess.run([sys.executable, "-m", "cues_platform.cli", "queue", "maintain",
                                           name, "--lake", str(self.lake_root)],
                                          capture_output=True, text=True, timeout=300)
                    if proc.returncode != 0:
                        raise RuntimeError(f"cues queue maintain exited {proc.returncode}: {proc.stderr[-500:]}")
                else:
                    report, _ = maintain_queue(lake.queue(name))
                    self.counts["retention_moves"] += sum(p.new_start > p.old_start for p in report.partitions)
                self.stats.maintenance_runs += 1
            except Exception as exc:  # noqa: BLE001 - reported; a lost race (retryable) is counted
                if getattr(exc, "retryable", False):
                    self.counts["maintenance_retries"] += 1
                else:
                    self.stats.maintenance_errors.append(f"maintain {name}: {type(exc).__name__}: {exc}"[:400])

    # -- the end -----------------------------------------------------------------------------------
    def finish(self) -> None:
        """After the drain: stop the actors, let the monthly lane and the lagging tailer catch up
        (every row they still needed must be there), record what they saw and a last footprint."""
        self.stop.set()
        self.months.put(None)
        self.bursts.put(None)
        for t in self.threads:
            t.join(timeout=300)
        for child in self.dead.values():
            child.signal(signal.SIGKILL)
        if self.monthly is not None:
            ok = self.burst(time.monotonic() + FINAL_BURST_S)
            self.record(event="monthly_burst", month="final", ok=ok, runner=self.monthly.name)
            if not ok:
                self.violations.append(f"the monthly lane did not catch up with {w.ENRICHED} within "
                                       f"{FINAL_BURST_S:.0f} s after the drain: {self.monthly.tail(800)}")
            self.monthly.signal(signal.SIGCONT)
            self.nemesis.kill(self.monthly, signal.SIGTERM, "monthly runner SIGTERM (end)")
        lagging = getattr(self, "lagging", None) or self._tailers(w.MERGED, "lagging", expendable=False)
        self.catch_up_lagging(lagging)
        expendable = getattr(self, "expendable", None)
        if expendable is not None:
            self.read_expendable(expendable)
            self.record(event="expendable", retained_away={p: t.retained_away for p, t in expendable.items()},
                        position={p: t.position for p, t in expendable.items()},
                        read=self.counts["expendable_reads"])
        self.record(event="lagging", position={p: t.position for p, t in lagging.items()},
                    read=self.counts["lagging_reads"])
        self.record(event="watch", dead=getattr(self, "watch", {}))
        self.sample("final")
        self.record(event="counts", **self.counts, violations=self.violations)

    def stop_all(self) -> None:
        self.stop.set()
        for child in [*self.dead.values(), *([self.monthly] if self.monthly else [])]:
            if child.alive:
                child.signal(signal.SIGCONT)
                child.signal(signal.SIGKILL)


def clock_file_for(run_dir: Path) -> str:
    """The shared clock offset file of a run (``CUES_CLOCK_FILE``)."""
    return str(run_dir / "clock")


def install_clock(run_dir: Path) -> None:
    """Point this process (and every child it starts) at the run's clock file, at offset 0."""
    export(clock.CLOCK_FILE_ENV, clock_file_for(run_dir))
    clock.reset()
