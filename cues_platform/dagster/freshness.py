"""Freshness of a processor's assets: the age of its oldest unread input row, from the queues.

Why not Dagster's ``FreshnessPolicy``: a time-window policy keys on the asset's last
materialization, and a drained lake launches no run (``sensors.py``), so an idle processor that
has read every row would turn stale for doing exactly the right thing. What a data engineer wants
to know is how long the oldest row a processor has not read yet has been waiting:

    age = now - commit time of the Delta version that wrote the first unread offset of the
          processor's laggiest lane                        (0, fresh, when nothing is unread)

read from the Delta logs only (``processing/idle.py``: the lanes' next offsets and positions, then
the commit entry naming that offset in ``cues.ranges``): no Spark, nothing written. A join waiting
for its other side ages like any processor (its unread rows wait); a source a join reads has the
age of the oldest row a join waits with for it (``fx`` is stale when ``convert`` waits for a
fixing). A source no join reads has no input, so no freshness check.

The asset check ``freshness`` (one per output asset of each processor with inputs and each source
a join reads; never blocking): WARN above ``warn_after`` (default 15 minutes), ERROR above
``fail_after`` (default 1 hour), passed otherwise. It is evaluated **without a run**: the
processor's new-data (or on-demand) sensor computes it at each tick and reports it as a runless
``AssetCheckEvaluation`` (``SensorResult(asset_events=...)``) when its level (fresh, WARN, ERROR)
differs from the newest stored evaluation of the check or that one is older than ``report_every``
(default 10 minutes: the UI's numbers stay current without an event every tick; the sensor's
cursor is untouched, the instance holds what was reported). The check is also executable, with the same code: the
UI's *Execute*, and a run of the asset by an asset selection (the UI's *Materialize*, a sensor's run
request: Dagster adds the selected assets' checks) evaluates it after the materialization (cheap:
Delta logs only). The graph's jobs as defined (``{graph}__all``, ``{graph}__{processor}``, the
recovery job) leave it out, so a full run or a re-execution from failure has no extra step.

Clocks: the commit timestamp is the writer's clock (delta-rs' ``commitInfo.timestamp``), ``now`` is
the evaluating process's clock (``time.time()``). A writer clock ahead of the evaluator makes a
fresh row look younger, down to a negative age: it is clamped to 0 and the difference is shown as
``clock_skew_seconds``; a writer clock behind it makes rows look older (a WARN up to the skew early).
The metadata carries both timestamps, so a skew is visible, not hidden.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetSelection,
    MetadataValue,
    asset_check,
)

from cues_platform.dagster.assets import LAKE_KEY, processor_keys
from cues_platform.errors import ConfigurationError
from cues_platform.processing.graph import Graph, Kind
from cues_platform.processing.idle import LaneWork, UnreadAge, family_oldest_unread, family_work

FRESHNESS_CHECK = "freshness"
FRESH, WARN, ERROR = "fresh", "WARN", "ERROR"


class FreshnessConfigError(ConfigurationError):
    """Freshness thresholds that cannot work (``warn_after`` above ``fail_after``, or not
    positive); carries them."""


@dataclass(frozen=True, kw_only=True)
class Freshness:
    """The thresholds of the ``freshness`` checks of a graph (``build_definitions(freshness=)``)."""

    warn_after: timedelta = timedelta(minutes=15)
    fail_after: timedelta = timedelta(hours=1)
    report_every: timedelta = timedelta(minutes=10)

    def __post_init__(self) -> None:
        if not timedelta(0) < self.warn_after <= self.fail_after or self.report_every <= timedelta(0):
            raise FreshnessConfigError(
                f"freshness thresholds warn_after={self.warn_after}, fail_after={self.fail_after}, "
                f"report_every={self.report_every}: each must be positive and warn_after <= "
                "fail_after; pass Freshness(warn_after=..., fail_after=...) with those bounds",
                warn_after=str(self.warn_after), fail_after=str(self.fail_after))


@dataclass(frozen=True)
class Verdict:
    """One evaluation: ``oldest`` (None: nothing unread), ``now_ms`` of the evaluating clock."""

    processor: str
    oldest: UnreadAge | None
    lag: int
    now_ms: int
    freshness: Freshness

    @property
    def raw_age_ms(self) -> int:
        """``now - commit time`` (negative: the writer's clock is ahead of this one)."""
        return 0 if self.oldest is None else self.now_ms - self.oldest.committed_ms

    @property
    def age_seconds(self) -> float:
        return max(0, self.raw_age_ms) / 1000

    @property
    def level(self) -> str:
        age = timedelta(seconds=self.age_seconds)
        return ERROR if age > self.freshness.fail_after else WARN if age > self.freshness.warn_after else FRESH

    @property
    def description(self) -> str:
        limits = (f"WARN above {_secs(self.freshness.warn_after)}, ERROR above "
                  f"{_secs(self.freshness.fail_after)}")
        if self.oldest is None:
            return f"{self.processor!r} has read every input row: fresh ({limits})"
        o = self.oldest
        bound = "" if o.exact else "at least "
        return (f"{self.processor!r}: oldest unread row {o.queue}/{o.partition}@{o.offset} (lane "
                f"{o.processor!r}) committed {_iso(o.committed_ms)}, {bound}{self.age_seconds:.0f} s "
                f"ago; {self.lag} row(s) unread ({limits})")

    def metadata(self, evaluated_by: str) -> dict[str, Any]:
        o = self.oldest
        return {
            "age_seconds": round(self.age_seconds, 3),
            "lag_rows": self.lag,
            "oldest_unread": f"{o.queue}/{o.partition}@{o.offset}" if o else "-",
            "lane": o.processor if o else "-",
            "written_by_version": (o.version if o.version is not None else -1) if o else -1,
            "committed_at": _iso(o.committed_ms) if o else "-",
            "evaluated_at": _iso(self.now_ms),
            "clock_skew_seconds": round(max(0, -self.raw_age_ms) / 1000, 3),
            "age_exact": o.exact if o else True,
            "warn_after_seconds": self.freshness.warn_after.total_seconds(),
            "fail_after_seconds": self.freshness.fail_after.total_seconds(),
            "evaluated_by": evaluated_by,
            "level": MetadataValue.text(self.level),
        }


def _secs(d: timedelta) -> str:
    return f"{d.total_seconds():.0f} s"


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def now_ms() -> int:
    """This process's clock (the one compared with the writers' commit timestamps)."""
    return int(time.time() * 1000)


def freshness_processors(graph: Graph) -> list[str]:
    """The declared processors with a freshness check: those with inputs, and sources a join reads."""
    out = []
    for family in graph.family_order():
        proc = graph.as_declared(family)
        outs = {o.queue for o in proc.outputs.values()}
        joined = proc.kind is Kind.SOURCE and any(
            p.kind is Kind.JOIN and any(i.queue in outs for i in p.inputs.values())
            for p in graph.processors.values())
        if proc.inputs or joined:
            out.append(family)
    return out


def evaluate(lake: Any, graph: Graph, family: str, freshness: Freshness, *,
             works: Sequence[LaneWork] | None = None, now: int | None = None) -> Verdict:
    """The freshness of processor ``family`` now (``now``: epoch ms, default this clock)."""
    if graph.as_declared(family).kind is Kind.SOURCE:
        works = []
    elif works is None:
        works = family_work(lake, graph, family)
    oldest = family_oldest_unread(lake, graph, family, works=works)
    lag = sum(w.lag for w in works) if works else (oldest.unread if oldest else 0)
    return Verdict(family, oldest, lag, now if now is not None else now_ms(), freshness)


def check_evaluations(verdict: Verdict, keys: Sequence[AssetKey], *,
                      evaluated_by: str) -> list[AssetCheckEvaluation]:
    """The runless evaluations of the ``freshness`` check of each of ``keys``."""
    meta = verdict.metadata(evaluated_by)
    return [AssetCheckEvaluation(asset_key=k, check_name=FRESHNESS_CHECK, passed=verdict.level == FRESH,
                                 severity=_severity(verdict), description=verdict.description,
                                 metadata=meta)
            for k in keys]


def _severity(verdict: Verdict) -> AssetCheckSeverity:
    return AssetCheckSeverity.ERROR if verdict.level == ERROR else AssetCheckSeverity.WARN


def last_reported(context: Any, key: AssetKey) -> dict[str, Any] | None:
    """The level and time (epoch ms) of the newest stored evaluation of ``key``'s ``freshness``
    check (a sensor's report or a run's), from the sensor's instance; None when there is none (or
    the context has no instance)."""
    from dagster import DagsterInvariantViolationError
    from dagster._core.storage.asset_check_execution_record import (
        COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES,
    )

    try:
        instance = context.instance
    except DagsterInvariantViolationError:
        return None
    records = instance.event_log_storage.get_asset_check_execution_history(
        AssetCheckKey(key, FRESHNESS_CHECK), limit=1, status=COMPLETED_ASSET_CHECK_EXECUTION_RECORD_STATUSES)
    event = records[0].event if records else None
    evaluation = event.dagster_event.event_specific_data if event is not None and event.dagster_event else None
    if evaluation is None:
        return None
    level = FRESH if evaluation.passed else ERROR if evaluation.severity == AssetCheckSeverity.ERROR else WARN
    return {"level": level, "at": int(records[0].create_timestamp * 1000)}


def sensor_report(verdict: Verdict, keys: Sequence[AssetKey], previous: Mapping[str, Any] | None, *,
                  sensor: str) -> tuple[list[AssetCheckEvaluation], dict[str, Any]]:
    """What a sensor tick reports, given the last stored report (:func:`last_reported`): the
    evaluations when the level changed or the last one is ``report_every`` old (or there is
    none), else nothing; and the report now current (``{"level", "at"}``)."""
    last = dict(previous or {})
    due = (last.get("level") != verdict.level or not isinstance(last.get("at"), int)
           or verdict.now_ms - last["at"] >= verdict.freshness.report_every.total_seconds() * 1000
           or verdict.now_ms < last["at"])  # the clock went back: report, do not wait
    if not due:
        return [], last
    return (check_evaluations(verdict, keys, evaluated_by=f"sensor {sensor}"),
            {"level": verdict.level, "at": verdict.now_ms})


def freshness_check_keys(graph: Graph, *, prefix: Sequence[str] = (),
                         processors: Sequence[str] | None = None) -> list[AssetCheckKey]:
    """The ``freshness`` check keys of ``processors`` (default: every one with a check)."""
    wanted = set(freshness_processors(graph))
    chosen = [p for p in (processors if processors is not None else wanted) if p in wanted]
    return [AssetCheckKey(k, FRESHNESS_CHECK) for p in chosen for k in processor_keys(graph.as_declared(p), prefix)]


def without_freshness(selection: AssetSelection, checks: Sequence[AssetCheckKey]) -> AssetSelection:
    """``selection`` minus the ``freshness`` checks ``checks``: the graph's jobs as defined
    (``{graph}__all``, a processor's, recovery) do not run them; the sensors report them."""
    return selection - AssetSelection.checks(*checks) if checks else selection


def build_freshness_checks(graph: Graph, *, prefix: Sequence[str] = (),
                           freshness: Freshness) -> list[Any]:
    """The executable ``freshness`` check of every output asset of :func:`freshness_processors`
    (non-blocking; the sensors report the same verdict without a run)."""
    checks = []
    for family in freshness_processors(graph):
        for key in processor_keys(graph.as_declared(family), prefix):
            checks.append(_check(graph, family, key, freshness))
    return checks


def _check(graph: Graph, family: str, key: AssetKey, freshness: Freshness) -> Any:
    @asset_check(asset=key, name=FRESHNESS_CHECK, blocking=False, required_resource_keys={LAKE_KEY},
                 description=f"Age of the oldest row processor {family!r} has not read (from the queues' "
                             f"Delta logs): WARN above {_secs(freshness.warn_after)}, ERROR above "
                             f"{_secs(freshness.fail_after)}; 0 when it has read everything. Reported "
                             "by its sensor without a run.")
    def _freshness(context) -> AssetCheckResult:  # noqa: ANN001 - Dagster reads the annotation at runtime (a string here)
        lake = getattr(context.resources, LAKE_KEY).lake()
        verdict = evaluate(lake, graph, family, freshness)
        return AssetCheckResult(passed=verdict.level == FRESH, severity=_severity(verdict),
                                description=verdict.description,
                                metadata=verdict.metadata(f"run {context.run.run_id}"))

    return _freshness


__all__ = ["ERROR", "FRESH", "FRESHNESS_CHECK", "WARN", "Freshness", "FreshnessConfigError", "Verdict",
           "build_freshness_checks", "check_evaluations", "evaluate", "freshness_check_keys",
           "freshness_processors", "last_reported", "now_ms", "sensor_report", "without_freshness"]
