"""The time nemesis's timing check reads step and recovery times from runners' event logs by
platform month (hand-written logs; no Spark, no lake)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from cues_platform.jepsen import workload as w
from cues_platform.jepsen.checker import Expectation
from cues_platform.jepsen.timecheck import MAX_RATIO, check_timing, timing_samples

REAL0_MS = 1_800_000_000_000
YEAR_S = 120.0  # a year in 120 real seconds: a platform month is 10 real seconds


def _ts(second: float) -> str:
    return datetime.fromtimestamp((REAL0_MS + second * 1000) / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _expectation(run_dir: Path) -> Expectation:
    start = {"event": "clock_start", "real0_ms": REAL0_MS, "rate": 365 * 86_400 / YEAR_S, "year_seconds": YEAR_S}
    return Expectation(acked=frozenset(), aborted_keys=frozenset(), known_keys=frozenset(), partition_of={},
                       time_records=(start,), run_dir=run_dir)


def _runner_log(run_dir: Path, name: str, events: list[tuple[float, str, dict]]) -> None:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    lines = ["=== a header line the parser skips", "WARNING: not JSON"]
    lines += [json.dumps({"ts": _ts(at), "event": event, **fields}) for at, event, fields in events]
    (run_dir / "logs" / f"{name}.log").write_text("\n".join(lines) + "\n")


def _start(at: float, recover_every: float) -> list[tuple[float, str, dict]]:
    """A runner start at ``at``: Spark ready 1 s later, then every lane recovered in turn."""
    out = [(at, "started", {}), (at + 1, "spark_ready", {})]
    out += [(at + 1 + (i + 1) * recover_every, "recovered", {"processor": lane}) for i, lane in enumerate(w.LANES)]
    return out


def _pass(at: float, family_seconds: float) -> list[tuple[float, str, dict]]:
    """One busy pass from ``at``: each family's two lanes step side by side, family after family."""
    out = []
    for i, family in enumerate(w.PROCESSORS):
        end = at + (i + 1) * family_seconds
        out += [(end - 0.001, "step", {"processor": family}), (end, "step", {"processor": f"{family}.1"})]
    return out


def test_samples_are_per_lane_recovery_and_per_family_step_by_platform_month(tmp_path):
    _runner_log(tmp_path, "runner-1", [*_start(-30, 0.01),  # registration, before the clock: left out
                                       *_pass(1, 0.5), (4, "idle", {}),  # month 0: 4 family steps
                                       *_pass(4.5, 0.7)])  # after an idle: its first family has no start
    _runner_log(tmp_path, "runner-2", [*_start(125, 0.02), *_pass(130, 0.4)])  # after the year: month 12
    _runner_log(tmp_path, "monthly-1", [*_start(50, 0.03),  # month 5 recoveries count
                                        (52, "step", {"processor": "monthly"}), (53, "step", {"processor": "monthly.1"})])
    recovery, steps = timing_samples(_expectation(tmp_path))
    assert sorted(recovery) == [5, 12] and len(recovery[12]) == len(w.LANES) and len(recovery[5]) == len(w.LANES)
    assert all(abs(x - 0.02) < 0.002 for x in recovery[12][1:])  # each lane after the first: its own time
    # the first family step of a pass has no start (after an idle or a recovery); a family's two lanes are one
    assert [round(x, 3) for x in steps[0]] == [0.5, 0.5, 0.5, 0.5, 0.7, 0.7, 0.7, 0.7]
    assert [round(x, 3) for x in steps[12]] == [0.4, 0.4, 0.4, 0.4]
    assert set(steps) == {0, 12}  # the monthly runner's steps are not the graph's mix of families


def test_timing_fails_above_the_ratio_and_names_the_months_compared(tmp_path):
    _runner_log(tmp_path, "runner-1", [*_start(5, 0.010), *_pass(15, 0.5)])
    _runner_log(tmp_path, "runner-2", [*_start(125, 0.010 * (MAX_RATIO + 0.3)), *_pass(130, 0.5)])
    counts: dict = {}
    result = check_timing(_expectation(tmp_path), counts)
    assert result.total_violations == 1 and result.violations[0].startswith("recovery time in months [12]: median")
    assert counts["recovery_first_months"] == "[0]" and counts["recovery_last_over_first_pct"] == 150
    assert counts["step_last_over_first_pct"] == 100


def test_timing_without_samples_at_one_end_fails(tmp_path):
    _runner_log(tmp_path, "runner-1", [*_start(125, 0.01), *_pass(130, 0.5)])  # only the drain
    result = check_timing(_expectation(tmp_path), {})
    assert [v.split(":")[0] for v in result.violations] == ["recovery time", "step time"]
    assert "too few samples to compare the year's start (months 0-6: 0)" in result.violations[0]
