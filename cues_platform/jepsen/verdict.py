"""What the independent checker knows and says: the :class:`Expectation` (what is known without
the platform) and the verdicts, one :class:`CheckResult` per check, gathered in a
:class:`CheckReport`.

Floor: the bottom of the checker, with ``lakeread``; ``checker`` and ``timecheck`` import it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cues_platform.jepsen import workload as w

EXAMPLES = 5


@dataclass(frozen=True)
class Expectation:
    """What the checker knows without the platform: the acknowledged keys (from the feeders' ack
    logs), the keys of transactions aborted on purpose, every key of the plan, and the user's
    rejection rule."""

    acked: frozenset[str]
    aborted_keys: frozenset[str]
    known_keys: frozenset[str]
    partition_of: Mapping[str, str]  # every planned key (aborted ones too) -> its partition
    is_rejected: Callable[[str], bool] = w.is_rejected
    # the rejecting processor isolates the keys it fails on (Options.on_error = isolate, the
    # harness's graph): an error row holding a key the rule accepts is then a violation
    isolated: bool = True
    redeploys: tuple[dict, ...] = ()  # the redeploy nemesis's records (workload.REDEPLOY_LOG)
    time_records: tuple[dict, ...] = ()  # the time nemesis's records (workload.TIME_LOG)
    run_dir: Path | None = None  # the runners' logs (the time nemesis's timing check reads them)
    # acknowledged key -> (input queue, partition, offset), from the feeders' AppendResult ranges
    offsets: Mapping[str, tuple[str, str, int]] = field(default_factory=dict)
    # (partition, offset, key) of every row of merged the lagging (non-expendable) tailer read
    merged_read: tuple[tuple[str, int, str], ...] = ()

    @classmethod
    def from_run(cls, plan: w.Plan, run_dir: str | Path) -> Expectation:
        return cls(acked=frozenset(w.acked_keys(plan, run_dir)), aborted_keys=plan.aborted_keys,
                   known_keys=plan.all_keys, partition_of=plan.partition_of,
                   redeploys=tuple(w.read_redeploys(run_dir)),
                   time_records=tuple(w.read_time_log(run_dir)), run_dir=Path(run_dir),
                   offsets=w.acked_offsets(plan, run_dir), merged_read=tuple(w.read_lagging(run_dir)))


@dataclass
class CheckResult:
    name: str
    checked: int = 0
    violations: list[str] = field(default_factory=list)
    total_violations: int = 0

    @property
    def ok(self) -> bool:
        return self.total_violations == 0

    def fail(self, message: str) -> None:
        self.total_violations += 1
        if len(self.violations) < EXAMPLES:
            self.violations.append(message)

    def to_dict(self) -> dict:
        return {"name": self.name, "ok": self.ok, "checked": self.checked,
                "violations": self.total_violations, "examples": self.violations}


@dataclass
class CheckReport:
    checks: list[CheckResult]
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.ok]

    def to_dict(self) -> dict:
        return {"ok": self.ok, "counts": self.counts, "checks": [c.to_dict() for c in self.checks]}


def format_checks(report: CheckReport) -> Iterable[str]:
    for c in report.checks:
        yield f"  {'PASS' if c.ok else 'FAIL'}  {c.name:<15} {c.checked:>7,} checked, {c.total_violations} violation(s)"
        for example in c.violations:
            yield f"          - {example}"
