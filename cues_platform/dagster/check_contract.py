"""The ``contract`` check: the queue's pandera contract on every row that arrived since the check
last judged, and on the rows it found failing that nobody handled yet.

What it judges, each evaluation (``check_memory`` holds how it remembers):

1. the rows committed since the memory's ``judged_to`` (a step of this run, recovery rolling a
   failed attempt forward, ``cues run`` outside Dagster, a producer: whoever committed them), up
   to each partition's last stable offset (rows of an undecided transaction wait for the next
   evaluation, so a transaction rolled forward later is judged then);
2. the rows still open from before (``open_failing``), under the contract as it is now;

minus the rows quarantined in the error queue (``check_quarantine``). Rows with a delivery hash
are validated; rows without one (written outside the protocol) are counted
(``rows_outside_protocol``) and judged by the ``outside_protocol`` check. Rows the queue's
retention removed before any evaluation judged them stay ``open_unjudged`` (severity WARN, never
green) until quarantined.

The check passes only when nothing is open: a red ``contract`` stays red across no-op runs,
retries and re-executions, until the failing rows are quarantined or pass (a contract fixed).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow.compute as pc

from cues_platform.dagster.check_memory import (
    ERROR_QUEUE,
    CheckMemory,
    Runs,
    count,
    describe,
    from_offsets,
    normalize,
    plan_window,
    stable_ends,
    union,
)
from cues_platform.dagster.check_quarantine import quarantined_runs
from cues_platform.queues import Lake, OffsetOutOfRangeError
from cues_platform.queues.schema import DELIVERY_HASH, OFFSET, RESERVED

CHUNK = 100_000  # offsets validated at once on the pandas path (bounds the driver's memory)
MAX_SAMPLES = 20


class Verdict:
    """What one evaluation found (``failing``: offsets that broke the contract)."""

    def __init__(self) -> None:
        self.failing: dict[str, list[int]] = {}
        self.failing_runs: Runs = {}  # whole runs failing (a validator that names no rows)
        self.failures: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.rows_checked = 0
        self.rows_outside_protocol = 0

    def add_failures(self, part: str, offsets: list[int], failures: list[dict[str, Any]],
                     run: list[int]) -> None:
        for f in failures:
            if f.get("index") is None:
                self.failing_runs = union(self.failing_runs, {part: [run]})
                self.failures.append({**f, "partition": part})
                continue
            offset = offsets[int(f["index"])]
            self.failing.setdefault(part, []).append(offset)
            self.failures.append({**f, "partition": part, "offset": offset})
            if len(self.samples) < MAX_SAMPLES:
                self.samples.append({"partition": part, "offset": offset, "check": f.get("check"),
                                     "column": f.get("column"), "failure_case": f.get("failure_case")})

    def open_runs(self) -> Runs:
        return union(from_offsets(self.failing), self.failing_runs)


def judge_pandas(lake: Lake, queue_name: str, contract: Any, readable: Runs, validate: Any) -> Verdict:
    queue = lake.queue(queue_name)
    payload = [c for c in queue.payload_schema.names if c not in RESERVED]
    verdict = Verdict()
    for part, spans in readable.items():
        for lo, hi in spans:
            for a in range(lo, hi, CHUNK):
                b = min(hi, a + CHUNK)
                table = queue.read_arrow(partition=part, start=a, end=b, columns=[OFFSET, DELIVERY_HASH, *payload])
                hashed = table.filter(pc.is_valid(table[DELIVERY_HASH]))
                verdict.rows_outside_protocol += table.num_rows - hashed.num_rows
                verdict.rows_checked += hashed.num_rows
                if not hashed.num_rows:
                    continue
                passed, failures = validate(contract, hashed.select(payload))
                if not passed:
                    verdict.add_failures(part, hashed[OFFSET].to_pylist(), failures, [a, b])
    return verdict


def judge_spark(lake: Lake, queue_name: str, contract: Any, readable: Runs, validate: Any, spark: Any) -> Verdict:
    """A ``pandera.pyspark`` contract on the Spark frame of every readable run: it names failing
    checks, not rows, so a failure keeps every judged run open."""
    from functools import reduce

    from pyspark.sql import functions as F

    queue = lake.queue(queue_name)
    payload = [c for c in queue.payload_schema.names if c not in RESERVED]
    verdict = Verdict()
    frames = [queue.read_spark(spark, partition=p, start=lo, end=hi) for p, spans in readable.items()
              for lo, hi in spans]
    if not frames:
        return verdict
    df = reduce(lambda x, y: x.unionByName(y), frames)
    counts = df.groupBy(F.col(DELIVERY_HASH).isNotNull().alias("hashed")).count().collect()
    by = {bool(r["hashed"]): int(r["count"]) for r in counts}
    verdict.rows_checked, verdict.rows_outside_protocol = by.get(True, 0), by.get(False, 0)
    if not verdict.rows_checked:
        return verdict
    passed, failures = validate(contract, df.where(F.col(DELIVERY_HASH).isNotNull()).select(*payload))
    if not passed:
        verdict.failing_runs = normalize(readable)
        verdict.failures = failures
    return verdict


def samples_markdown(samples: list[dict[str, Any]]) -> str:
    lines = ["| partition | offset | column | check | value |", "|---|---|---|---|---|"]
    lines += [f"| {s['partition']} | {s['offset']} | {s['column']} | {s['check']} | {s['failure_case']} |"
              for s in samples]
    return "\n".join(lines)


def evaluate(lake: Lake, queue_name: str, contract: Any, *, memory: CheckMemory, error_queue: str | None,
             spark: Any, validate: Any, counts_of: Any, retries: int) -> tuple[bool, bool, dict[str, Any]]:
    """One evaluation: (passed, failing at severity ERROR, metadata with the new memory)."""
    for attempt in range(retries):
        try:
            return _evaluate(lake, queue_name, contract, memory=memory, error_queue=error_queue,
                             spark=spark, validate=validate, counts_of=counts_of)
        except OffsetOutOfRangeError:  # retention moved a start offset while judging: plan again
            if attempt == retries - 1:
                raise
    raise AssertionError("unreachable")


def _evaluate(lake: Lake, queue_name: str, contract: Any, *, memory: CheckMemory, error_queue: str | None,
              spark: Any, validate: Any, counts_of: Any) -> tuple[bool, bool, dict[str, Any]]:
    quarantined = quarantined_runs(lake, error_queue=error_queue, queue=queue_name) if error_queue else {}
    window = plan_window(lake, queue_name, memory=memory, quarantined=quarantined)
    memory, readable, unjudged, notes = window.memory, window.readable, window.unjudged, list(window.notes)

    judge = judge_pandas if spark is None else (lambda *a: judge_spark(*a, spark))
    verdict = judge(lake, queue_name, contract, readable, validate)
    new_memory = window.next_memory(verdict.open_runs())
    open_failing = new_memory.open_failing

    by_check: dict[str, int] = {}
    for f in verdict.failures:
        name = f"{f.get('column')}: {f.get('check')}"
        by_check[name] = by_check.get(name, 0) + 1
    meta: dict[str, Any] = {
        "queue": queue_name,
        "memory_from_run": memory.run_id or "none: judged from offset 0",
        "judged_ranges": readable,
        "arrived_ranges": window.arrived,
        "rows_checked": verdict.rows_checked,
        "rows_outside_protocol": verdict.rows_outside_protocol,
        **{k: v for k, v in counts_of(verdict.failures).items() if v is not None},
        "failed_checks": sorted(by_check),
        "failures_by_check": by_check,
        "open_failing_rows": count(open_failing),
        "open_unjudged_rows": count(unjudged),
        "closed_by_quarantine_rows": count(window.closed_by_quarantine),
        "details": json.dumps(verdict.failures[:MAX_SAMPLES], default=str),
        **new_memory.metadata(),
        ERROR_QUEUE: error_queue or "",
    }
    if verdict.samples:
        meta["failing_rows_sample"] = samples_markdown(verdict.samples)
    if open_failing:
        fix = (f"quarantine them (`cues quarantine list {queue_name}`, then `cues quarantine add "
               f"{queue_name} --check contract --all-open --reason ...`: copied into error queue "
               f"{error_queue!r})"
               if error_queue else "the graph has no error queue to quarantine them in")
        meta["what_to_do"] = (f"rows at {describe(open_failing)} break the contract and stay in the queue "
                              f"(downstream reads them): fix the contract if it is wrong (they pass then), "
                              f"or {fix}; the check stays red until one of the two")
    if unjudged:
        meta["retained_away"] = unjudged
        notes.append(f"never judged: the rows at {describe(unjudged)} were removed by the queue's "
                     "retention before any evaluation of this check read them; quarantine them "
                     "(an acknowledgement, no payload is left) to close them")
    if notes:
        meta["note"] = "; ".join(notes)
    return not open_failing and not unjudged, bool(open_failing), meta


__all__ = ["CHUNK", "Verdict", "evaluate", "stable_ends"]
