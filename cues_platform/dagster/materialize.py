"""One processor materialization: its run config (bounds, fault injection), the driving loop
(recovery, then steps until drained or a bound is hit), its failure headline and its
materialization metadata."""

import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from dagster import Config, Failure, RetryRequested
from pydantic import Field

from cues_platform.errors import CuesError
from cues_platform.processing.graph import Graph, Processor
from cues_platform.processing.outputs import delivered_to
from cues_platform.processing.runner import GraphRunner, ProcessorStats
from cues_platform.processing.step import StepResult


class InjectedFailure(CuesError, RuntimeError):
    """Raised by the fault-injection hook of :class:`ProcessorRunConfig` (tests, drills).

    Carries ``processor``, ``point`` and ``step``. Retrying helps: recovery resolves whatever the
    failure left behind (with ``inject_failure_once_file`` the fault does not fire again)."""

    retryable = True


class FaultConfig(Config):
    """Fault injection, for tests and recovery drills (launchpad: ``ops.<processor>.config``).

    Fail the run at protocol point ``inject_failure_at`` (``recovery_fenced``,
    ``before_snapshot``, ``after_snapshot``, ``after_read``, ``after_function``,
    ``after_prepare``, ``after_attempt``, ``between_commits``, ``after_commit``) of step
    ``inject_failure_step`` (any step when unset). With ``inject_failure_once_file`` it fires only
    while that file does not exist and creates it, so a retry of the run succeeds.
    ``inject_failure_mode``: ``raise`` an :class:`InjectedFailure` (Dagster fails the step), or
    ``sigkill`` the run process itself (a real crash: no ``finally`` runs, Dagster never hears
    back). Points inside the runner face's function call (``after_read``, ``after_function``) are
    handled like a user error (error queue) in ``raise`` mode, not as a crash.
    """

    inject_failure_at: str | None = None
    inject_failure_step: int | None = None
    inject_failure_once_file: str | None = None
    inject_failure_mode: Literal["raise", "sigkill"] = "raise"


class ProcessorRunConfig(FaultConfig):
    """Run config of one runner-face processor materialization (launchpad:
    ``ops.<processor>.config``): bounds, and the fault injection of :class:`FaultConfig`.

    The run stops stepping when any bound is reached (the next run goes on from there); none set
    means "until the inputs are drained".
    """

    max_steps: int | None = Field(default=None, description="stop after this many steps")
    max_rows: int | None = Field(default=None, description="stop once this many input rows are read")
    max_seconds: float | None = Field(default=None, description="stop stepping after this long")


# -- running ------------------------------------------------------------------------------------
def fault_hook(config: FaultConfig, processor_id: str,
               stepper_of: Callable[[], Any]) -> Callable[[str], None] | None:
    if not config.inject_failure_at:
        return None

    def hook(point: str) -> None:
        if point != config.inject_failure_at:
            return
        stepper = stepper_of()
        pending = getattr(stepper, "pending", None)
        step = pending.step if pending is not None else getattr(stepper, "next_step", None)
        if config.inject_failure_step is not None and step != config.inject_failure_step:
            return
        if config.inject_failure_once_file:
            marker = Path(config.inject_failure_once_file)
            if marker.exists():
                return
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"{processor_id} {point} step {step}\n")
        if config.inject_failure_mode == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedFailure(f"injected failure at {point} of step {step} (processor {processor_id!r})",
                              processor=processor_id, point=point, step=step)

    return hook


# -- failure headlines ----------------------------------------------------------------------------
HEADLINE_CHARS = 400


def headline(exc: BaseException) -> str:
    """One line naming the cause: ``PlatformStepError: <the first line of its message>``."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__
    return text if len(text) <= HEADLINE_CHARS else text[:HEADLINE_CHARS - 1] + "…"


def _plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


def step_failure(exc: Exception, *, processor: str) -> Failure:
    """Dagster's :class:`~dagster.Failure` for ``exc``: its description (the run's failure
    headline in the UI and the console) is :func:`headline`, its metadata the processor, the
    error's qualified class, whether retrying helps and a :class:`CuesError`'s data. Op retries
    stay allowed (a retry starts with recovery, whatever the error)."""
    cls = type(exc)
    meta: dict[str, Any] = {"cues/processor": processor,
                            "cues/error": f"{cls.__module__}.{cls.__qualname__}",
                            "cues/retryable": bool(getattr(exc, "retryable", False))}
    if isinstance(exc, CuesError) and exc.data:
        meta["cues/error_data"] = {k: _plain(v) for k, v in sorted(exc.data.items())}
    return Failure(description=headline(exc), metadata=meta, allow_retries=True)


@contextmanager
def failure_headline(processor: str) -> Iterator[None]:
    """Run a processor's step code so that an exception fails the op as :func:`step_failure`
    (chained: the exception stays the cause, with its traceback, under "View full message")
    instead of Dagster's generic "Error occurred while executing op ...". Dagster's own control
    flow (``Failure``, ``RetryRequested``, interrupts) passes through unchanged."""
    try:
        yield
    except (Failure, RetryRequested):
        raise
    except Exception as exc:
        raise step_failure(exc, processor=processor) from exc


def drive(runner: GraphRunner, pid: str, config: ProcessorRunConfig) -> str:
    """Recovery of ``pid``, then ``step_once`` until drained or a bound is hit; returns why it
    stopped. The bounds hold per lane (each partition of an every-partition binding). An
    exception fails the op with its one-line headline (:func:`failure_headline`)."""
    with failure_headline(pid):
        return _drive(runner, pid, config)


def _drive(runner: GraphRunner, pid: str, config: ProcessorRunConfig) -> str:
    started = time.monotonic()
    runner.recover([pid])
    steps = rows = 0
    while True:
        if config.max_steps is not None and steps >= config.max_steps:
            return "max_steps"
        if config.max_rows is not None and rows >= config.max_rows:
            return "max_rows"
        if config.max_seconds is not None and time.monotonic() - started >= config.max_seconds:
            return "max_seconds"
        result = runner.step_once(pid)
        if result is None:
            return "drained"
        steps += 1
        rows += result.rows_in or sum(result.rows_out.values())


def _ranges(results: Sequence[StepResult]) -> dict[str, str]:
    spans: dict[str, list[int]] = {}
    for r in results:
        for rng in r.inputs.values():
            if not rng.size:
                continue
            key = f"{rng.queue}/{rng.partition}"
            lo, hi = spans.get(key, [rng.start, rng.end])
            spans[key] = [min(lo, rng.start), max(hi, rng.end)]
    return {k: f"[{lo}, {hi})" for k, (lo, hi) in sorted(spans.items())}


WRITTEN_RANGES = "cues/written_ranges"  # {partition: [start, end)} a materialization added
# {partition: [start, end)} added to the queue since the previous materialization's end offsets,
# by anyone (shown in the UI; no check judges from it: contract and outside_protocol remember what
# they judged themselves, dagster/check_memory.py)
ARRIVED_RANGES = "cues/arrived_ranges"
END_OFFSETS = "cues/end_offsets"


def latest_metadata(instance: Any, key: Any) -> Mapping[str, Any] | None:
    """The metadata values of the asset's latest materialization (None: never materialized)."""
    event = instance.get_latest_materialization_event(key)
    mat = event.asset_materialization if event is not None else None
    return None if mat is None else {k: v.value for k, v in mat.metadata.items()}


def written_ranges(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, list[int]]:
    """The offsets added to each partition between two ``end_offsets`` readings (half-open)."""
    return {p: [before.get(p, 0), end] for p, end in sorted(after.items()) if end > before.get(p, 0)}


def pending_delivery(lake: Any, processor_id: str, record: Any, *, home: str | None = None) -> bool:
    """True when ``record`` is an attempt whose commits are not all in its queues yet, the home
    queue's closing commit included (recovery will roll it forward); False for a delivered
    attempt, a snapshot or no record."""
    if record is None or not record.is_attempt:
        return False
    queues = set(record.outputs.get("files", {})) | ({home} if home else set())
    return not all(delivered_to(lake.queue(q), processor_id, record.step) for q in sorted(queues))


def run_metadata(graph: Graph, proc: Processor, runner: GraphRunner, stopped: str,
                 found: dict[str, Any], rolled_forward: bool, elapsed: float) -> dict[str, Any]:
    """Metadata shared by every output of one processor materialization.

    Recovery re-reports the last attempt even when it was delivered already; such a no-op is not
    counted as a step here (``rolled_forward`` says whether recovery committed anything)."""
    stats: ProcessorStats = runner.stats[proc.id]
    results = [r for r in stats.results if rolled_forward or not r.recovered]
    return step_metadata(graph, proc, lake=runner.lake, stepper=runner.steppers[proc.id],
                         results=results, stopped=stopped, found=found, elapsed=elapsed)


SUMMED = ("cues/steps", "cues/rows_in", "cues/rows_out", "cues/rows_to_errors",
          "cues/recovered_attempts", "cues/lag_total")


def merge_lane_metadata(graph: Graph, lanes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One materialization's metadata from its lanes' (``run_metadata`` each): a processor
    without lanes keeps its own; otherwise counters are summed, ``cues/lag`` and
    ``cues/input_ranges`` (keyed by queue/partition) merged, and ``cues/partitions`` holds each
    lane's lag, steps, last step and hash by partition."""
    if len(lanes) == 1:
        return dict(next(iter(lanes.values())))
    metas = list(lanes.values())
    meta: dict[str, Any] = {k: sum(m[k] for m in metas) for k in SUMMED}
    meta["cues/outcomes"] = {k: sum(m["cues/outcomes"][k] for m in metas) for k in ("output", "error", "nil")}
    meta["cues/lag"] = {k: v for m in metas for k, v in m["cues/lag"].items()}
    meta["cues/input_ranges"] = {k: v for m in metas for k, v in m["cues/input_ranges"].items()}
    meta["cues/seconds"] = max(m["cues/seconds"] for m in metas)
    stops = sorted({m["cues/stopped"] for m in metas})
    meta["cues/stopped"] = stops[0] if len(stops) == 1 else ", ".join(stops)
    meta["cues/partitions"] = {
        graph.processors[lane].lane or "0": {
            "processor": lane, "lag": m["cues/lag_total"], "steps": m["cues/steps"],
            "last_step": m.get("cues/last_step"), "last_delivery_hash": m.get("cues/last_delivery_hash")}
        for lane, m in lanes.items()}
    return meta


def step_metadata(graph: Graph, proc: Processor, *, lake: Any, stepper: Any,
                  results: Sequence[StepResult], stopped: str, found: dict[str, Any],
                  elapsed: float) -> dict[str, Any]:
    """The metadata of the steps one materialization delivered (both asset faces)."""
    err = graph.error_queue_of(proc)
    # every row a step sent to the error queue: a failed step's error row, and the contract breaks
    # of a step that delivered its other rows (outcome "output")
    to_errors = sum(r.rows_out.get(err, 0) for r in results) if err else 0
    outcomes = {k: sum(r.outcome == k for r in results) for k in ("output", "error", "nil")}
    lag: dict[str, int] = {}
    for binding, src in proc.inputs.items():
        queue = lake.queue(src.queue)
        pos = getattr(stepper, "positions", {}).get(binding, 0)
        lag[f"{src.queue}/{src.partition}"] = max(0, queue.next_offset(src.partition) - pos)
    rows_out = sum(sum(r.rows_out.values()) for r in results)
    meta: dict[str, Any] = {
        "cues/steps": len(results),
        "cues/stopped": stopped,
        "cues/outcomes": outcomes,
        "cues/input_ranges": _ranges(results),
        "cues/rows_in": sum(r.rows_in for r in results),
        "cues/rows_out": rows_out - to_errors,
        "cues/rows_to_errors": to_errors,
        "cues/recovered_attempts": sum(r.recovered for r in results),
        "cues/lag": lag,
        "cues/lag_total": sum(lag.values()),
        "cues/seconds": round(elapsed, 3),
    }
    if found:
        meta["cues/recovery_found"] = found
    pending = getattr(stepper, "pending", None)
    if results:
        meta["cues/first_delivery_hash"] = results[0].delivery_hash
        meta["cues/last_delivery_hash"] = results[-1].delivery_hash
        meta["cues/first_step"] = results[0].step
        meta["cues/last_step"] = results[-1].step
    if pending is not None:
        meta["cues/pending_step"] = pending.step
    return meta


def queue_metadata(instance: Any, key: Any, queue: Any, *, before: Mapping[str, int],
                   results: Sequence[StepResult]) -> dict[str, Any]:
    """The metadata of one output queue's asset: what this materialization added to it."""
    count = queue.count()
    after = queue.end_offsets()
    previous = (latest_metadata(instance, key) or {}).get(END_OFFSETS)
    return {
        "cues/queue": queue.name,
        "cues/rows_out_to_queue": sum(r.rows_out.get(queue.name, 0) for r in results),
        "cues/queue_rows": count,
        "dagster/row_count": count,
        "cues/delta_version": queue.version(),
        END_OFFSETS: after,
        # the offsets this materialization added
        WRITTEN_RANGES: written_ranges(before, after),
        # everything added since the previous materialization, by anyone
        ARRIVED_RANGES: written_ranges(
            {str(p): int(o) for p, o in dict(previous).items()} if previous is not None else {}, after),
    }
