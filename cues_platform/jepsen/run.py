"""One harness run: set up the lake, feed it under the nemesis, heal, drain, check, report.

Delivery contract of :func:`run_harness`:

1. Print the seed first (``--seed`` replays the same plan and fault schedule).
2. Create the graph's queues and the transactional feeder's progress queue.
3. Start the feeders and one runner; for ``duration`` seconds let the nemesis act (kills of every
   kind, concurrent runners) while maintenance and a tailer race in the background (until the
   drain is over). The faults go on past ``duration`` until ``min_kills`` processes were killed
   (at most ``MAX_EXTRA_FAULT_SECONDS`` more): a slow machine, whose Spark takes most of the
   window to start, must not turn a run into one without faults. With ``redeploy``, the nemesis
   also redeploys the graph among its versions (``workload.VARIANTS``), and the faults go on until
   ``min_redeploys`` compatible redeploys and as many incompatible attempts were made (the extra
   time redeploys only, an incompatible version first whenever one is certain to be refused).
4. Heal: stop the faults, let every feeder finish (restarting killed ones), stop the runners.
5. Drain: ``cues run --idle-exit`` until no processor has work (retried if it fails, which is
   reported).
6. Check the lake with the independent checker and print the one-screen report.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cues_platform.jepsen import timewarp as tw
from cues_platform.jepsen import workload as w
from cues_platform.jepsen.checker import CheckReport, Expectation, check_lake, format_checks
from cues_platform.jepsen.feeders import UNVERIFIED_LOG
from cues_platform.jepsen.nemesis import GRAPH_REF, Background, Nemesis, Stats
from cues_platform.processing.loader import load_graph
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake

MAX_EXTRA_FAULT_SECONDS = 180.0
CALM_S = 30.0  # --time: the most real seconds a fresh runner is left alone to recover and go idle


def calm(nemesis: Nemesis, deadline: float) -> None:
    """Keep a runner going until it recovered every lane and reported a pass with no work
    (``idle``), or ``deadline``: under ``--time`` the faults leave the graph time to step, so step
    and recovery times are sampled all year long (Spark alone takes 5-50 s to start here)."""
    while time.monotonic() < deadline:
        nemesis.tend()
        runner = nemesis.runners[-1] if nemesis.runners else None
        if runner is not None and any(e.get("event") == "idle" for e in runner.events()):
            return
        time.sleep(0.25)


@dataclass(frozen=True)
class HarnessConfig:
    seed: int
    workdir: Path
    duration: float = 90.0  # seconds of faults
    keys: int = 2_000
    idem_feeders: int = 2
    lost_ack_rate: float = 0.05
    concurrent: bool = True
    maintenance: bool = True
    resend_in_txn: bool = False
    min_kills: int = 3  # faults go on past ``duration`` until this many kills (Step 3)
    redeploy: bool = False  # the redeploy nemesis (graph versions between restarts)
    min_redeploys: int = 0  # with redeploy: go on until this many compatible and incompatible ones
    time: bool = False  # the time nemesis: a year of the platform clock in ``duration`` seconds
    drain_timeout: float = 600.0
    idle_exit: float = 6.0


@dataclass
class HarnessResult:
    config: HarnessConfig
    report: CheckReport
    stats: Stats
    acked: int
    sent_keys: int
    drain_attempts: int
    anomalies: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    time_counts: dict = field(default_factory=dict)
    unverified_resends: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.report.ok and not self.anomalies

    def replay_command(self) -> str:
        c = self.config
        flags = [f"--lost-ack-rate {c.lost_ack_rate:g}"] if c.lost_ack_rate != 0.05 else []
        flags += [f"--min-kills {c.min_kills}"] if c.min_kills != 3 else []
        flags += [f"--min-redeploys {c.min_redeploys}"] if c.redeploy and c.min_redeploys else []
        flags += [f for f, on in (("--redeploy", c.redeploy), ("--no-concurrent", not c.concurrent),
                                  ("--no-maintenance", not c.maintenance),
                                  ("--resend-in-txn", c.resend_in_txn), ("--time", c.time)) if on]
        return " ".join([f"python -m cues_platform.jepsen --seed {c.seed} --duration {c.duration:g} "
                         f"--keys {c.keys}", *flags])

    def lines(self) -> list[str]:
        s, c = self.stats, self.config
        out = [f"jepsen seed {c.seed}: {'PASS' if self.ok else 'FAIL'} in {self.elapsed:.0f}s "
               f"(replay: {self.replay_command()})",
               f"  lake {c.workdir / 'lake'}",
               f"  keys: {self.sent_keys:,} planned, {self.acked:,} acknowledged, "
               f"{self.report.counts.get('visible_input_keys', 0):,} visible, "
               f"{self.report.counts.get('keys_in_error_rows', 0):,} rejected with their batch "
               f"({self.report.counts.get('error_rows', 0)} error rows)",
               f"  kills: {sum(s.kills.values())} — " + ", ".join(f"{k} {n}" for k, n in sorted(s.kills.items())),
               f"  runners started {s.runner_starts}, feeders started {s.feeder_starts}, "
               f"concurrent periods {s.concurrent_periods}, maintenance runs {s.maintenance_runs}, "
               f"tailer rows {s.tailer_rows}, drain attempts {self.drain_attempts}"]
        if c.redeploy:
            r = s.redeploys
            out.append(f"  redeploys: compatible {r['compatible']}, incompatible {r['incompatible']} "
                       f"(refused {r['refused']}: " + ", ".join(f"{k} {n}" for k, n in sorted(s.refusals.items()))
                       + f"; not refused {r['not refused']}), deferred (step in flight) {r['deferred']}")
        if c.time and self.time_counts:
            t = self.time_counts
            out.append(f"  time: a year in {c.duration:g} s ({365 / c.duration:.1f} days/s); "
                       + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in t.items() if k != "violations"))
        if c.time:
            k = self.report.counts
            out += [f"  {what} time: months {k.get(f'{what}_first_months')} median {k.get(f'{what}_first_median_ms')} ms, "
                    f"months {k.get(f'{what}_last_months')} {k.get(f'{what}_last_median_ms')} ms: last/first "
                    f"{k.get(f'{what}_last_over_first_pct')}% (1.2x {'met' if k.get(f'{what}_within_1_2') else 'NOT met'}; "
                    f"noise between adjacent months {k.get(f'{what}_adjacent_month_noise_pct')}%)"
                    for what in ("recovery", "step") if f"{what}_first_months" in k]
        if self.unverified_resends:
            out.append(f"  resends the queue could no longer verify (log cleaned up; counted as acknowledged, "
                       f"the key checked in the queue or downstream): {len(self.unverified_resends)}")
        if s.expected_exits:
            out.append("  expected exits: " + ", ".join(f"{k} {n}" for k, n in s.expected_exits.items()))
        out += list(format_checks(self.report))
        for title, items in (("anomalies", self.anomalies),
                             ("incompatible versions not refused", s.silent_changes),
                             ("unexpected process exits", s.unexpected_exits),
                             ("maintenance errors", s.maintenance_errors),
                             ("tailer errors", s.tailer_errors)):
            if items:
                out.append(f"  {title} ({len(items)}):")
                out += [f"    - {item[:300]}" for item in items[:5]]
        return out

    def to_dict(self) -> dict:
        s = self.stats
        return {"seed": self.config.seed, "ok": self.ok, "elapsed": self.elapsed,
                "keys": self.sent_keys, "acked": self.acked, "kills": dict(s.kills),
                "concurrent_periods": s.concurrent_periods, "runner_starts": s.runner_starts,
                "feeder_starts": s.feeder_starts, "maintenance_runs": s.maintenance_runs,
                "tailer_rows": s.tailer_rows, "maintenance_errors": s.maintenance_errors, "tailer_errors": s.tailer_errors,
                "unexpected_exits": s.unexpected_exits, "anomalies": self.anomalies,
                "drain_attempts": self.drain_attempts, "actions": s.actions,
                "redeploys": dict(s.redeploys), "refusals": dict(s.refusals),
                "silent_changes": s.silent_changes, "time": self.time_counts,
                "unverified_resends": self.unverified_resends,
                "report": self.report.to_dict()}


def _setup(lake_root: Path) -> None:
    lake = Lake(root=str(lake_root))
    create_queues(load_graph(GRAPH_REF), lake)
    lake.create_queue(w.TXN_PROGRESS, schema=w.PROGRESS, partitions=(w.PROGRESS_PARTITION,), exist_ok=True)


def run_harness(config: HarnessConfig, *, echo: Callable[[str], None] = print) -> HarnessResult:
    """Run the harness once; see the module docstring."""
    # Step 1
    echo(f"jepsen seed: {config.seed}")
    started = time.monotonic()
    workdir = config.workdir
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    lake_root = workdir / "lake"
    plan = w.Plan(seed=config.seed, keys=config.keys, idem_feeders=config.idem_feeders)
    if config.time:
        tw.install_clock(workdir)  # before anything starts: every child inherits CUES_CLOCK_FILE
    # Step 2
    _setup(lake_root)
    if config.time:
        tw.setup_time(lake_root)
    rate = tw.rate_of(config.duration)
    nemesis = Nemesis(lake_root=lake_root, run_dir=workdir, seed=config.seed, plan=plan,
                      feed_seconds=config.duration * (0.9 if config.time else 0.6),
                      lost_ack_rate=config.lost_ack_rate,
                      resend_in_txn=config.resend_in_txn, concurrent=config.concurrent,
                      redeploy=config.redeploy,
                      txn_timeout=tw.TXN_TIMEOUT_REAL_S * rate if config.time else None)
    background = Background(lake_root=lake_root, seed=config.seed, stats=nemesis.stats,
                            log=workdir / "logs" / "maintenance.log", plan=plan,
                            maintain=not config.time)
    timewarp = (tw.TimeNemesis(lake_root=lake_root, run_dir=workdir, seed=config.seed,
                               year_seconds=config.duration, nemesis=nemesis) if config.time else None)
    drain_attempts = 0
    try:
        # Step 3
        if timewarp is not None:  # every lane registers before retention may run
            timewarp.register_graph(time.monotonic() + 300)
            timewarp.start()
        nemesis.tend()
        if config.maintenance:
            background.start()
        until = time.monotonic() + config.duration
        last_call = until + MAX_EXTRA_FAULT_SECONDS
        redeploys = nemesis.stats.redeploys

        def redeploys_short() -> bool:
            return config.redeploy and min(redeploys["compatible"], redeploys["incompatible"]) < config.min_redeploys

        while time.monotonic() < until or (
                (sum(nemesis.stats.kills.values()) < config.min_kills or redeploys_short())
                and time.monotonic() < last_call):
            nemesis.tend()
            act_until = max(until, min(last_call, time.monotonic() + 10))
            if time.monotonic() >= until and redeploys_short():
                nemesis.redeploy_now(act_until, incompatible_first=True)
            else:
                nemesis.act(act_until)
            if config.time:  # let a runner work between faults: a year of steps to time, not only starts
                calm(nemesis, min(until, time.monotonic() + CALM_S))
        echo(f"jepsen seed {config.seed}: faults over ({sum(nemesis.stats.kills.values())} kills); healing")
        # Step 4 (maintenance and the tailer go on racing until the drain is over)
        deadline = time.monotonic() + config.drain_timeout
        while len(nemesis.done_feeders) < len(nemesis.feeder_names()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"feeders did not finish within {config.drain_timeout:.0f}s; "
                                   f"logs in {workdir / 'logs'}")
            nemesis.tend()
            for child in nemesis.feeders.values():
                if child.alive:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.proc.wait(timeout=1.0)
                    break
        for runner in list(nemesis.runners):
            nemesis.kill(runner, signal.SIGTERM, "runner SIGTERM (heal)")
            nemesis.runners.remove(runner)
        # Step 5
        while True:
            drain_attempts += 1
            runner = nemesis.start_runner(idle_exit=config.idle_exit)
            try:
                rc = runner.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                nemesis.kill(runner, signal.SIGKILL, "runner SIGKILL (drain timed out)")
                raise TimeoutError(f"the drain did not finish within {config.drain_timeout:.0f}s; "
                                   f"logs in {workdir / 'logs'}") from None
            nemesis.runners.remove(runner)
            if rc == 0:
                break
            nemesis._note_runner_exit(runner)
            if drain_attempts >= 3:
                raise RuntimeError(f"the drain runner failed {drain_attempts} times; last: "
                                   f"{runner.tail(1500)}")
        if timewarp is not None:
            timewarp.finish()
    finally:
        if timewarp is not None:
            timewarp.stop_all()
        background.join()
        nemesis.stop_all()
    # Step 6
    expectation = Expectation.from_run(plan, workdir)
    report = check_lake(lake_root, expectation)
    anomalies_log = workdir / "anomalies.log"
    anomalies = anomalies_log.read_text().splitlines() if anomalies_log.exists() else []
    unverified_log = workdir / UNVERIFIED_LOG
    unverified = unverified_log.read_text().splitlines() if unverified_log.exists() else []
    result = HarnessResult(config=config, report=report, stats=nemesis.stats,
                           acked=len(expectation.acked), sent_keys=len(plan.all_keys),
                           drain_attempts=drain_attempts, anomalies=anomalies,
                           elapsed=time.monotonic() - started,
                           time_counts=dict(timewarp.counts) if timewarp is not None else {},
                           unverified_resends=unverified)
    (workdir / "report.json").write_text(json.dumps(result.to_dict(), indent=2, default=str))
    for line in result.lines():
        echo(line)
    sys.stdout.flush()
    return result
