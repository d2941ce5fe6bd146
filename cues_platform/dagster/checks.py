"""Asset checks on processor outputs.

Blocking (a failure stops downstream assets in the run):

- ``contract``: the queue's pandera contract (``QueueDef.contract``) on every row that arrived
  since the check last judged (whoever committed it: a step of this run, recovery rolling a
  failed attempt forward, ``cues run`` outside Dagster) and on the rows it found failing before
  that nobody handled: it stays red across no-op runs, retries and re-executions until those rows
  are quarantined (``check_quarantine``) or pass (the contract fixed). Its memory (judged up to
  which offset per partition, which rows are still open) is the metadata of its own previous
  evaluation in Dagster's event log (``check_memory``); the judging is ``check_contract``. Rows
  with a delivery hash are validated; rows without one are counted and left to
  ``outside_protocol``. A ``pandera.pandas`` contract is validated on Arrow -> pandas chunks
  (``lazy=True``: every failure, each mapped back to its offset); a ``pandera.pyspark`` contract
  validates the Spark DataFrame (it names checks, not rows: a failure keeps every judged row
  open). Rows the queue's retention removed before any evaluation judged them are reported as
  ``retained_away`` (severity WARN, never green) until quarantined.
- ``exactly_once``: ``cues_platform.audit.audit(lake)``; fails on any violation in this queue or
  of this processor (gaps, overlaps, rows delivered twice, unknown hashes, ...) except rows
  written outside the protocol, which the next check reports.

Not blocking (severity WARN: the pipeline goes on, the UI shows it):

- ``outside_protocol``: rows of this exactly-once output without a delivery hash (a producer, a
  script or a person appended them, not a processor step) among every row committed since the
  check last judged, with the same memory as ``contract`` (``check_memory``): a row it finds
  stays open (the check failed, WARN) across no-op runs, retries and re-executions until it is
  quarantined (``check_quarantine``; ``cues quarantine add``: the operator's reason and the
  row's payload recorded in the error queue, which is what "handled" means for such a row: it
  never gains a hash). Metadata: how many, their offsets, a sample, how many break the queue's
  contract. They stay in the queue (it is append-only) and downstream processors read them like
  any row; ``docs/dagster.md`` shows the operator's way out.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    asset_check,
    multi_asset_check,
)

from cues_platform.audit import audit
from cues_platform.audit.report import NO_DELIVERY_HASH
from cues_platform.dagster.assets import (
    LAKE_KEY,
    SPARK_KEY,
    external_queues,
    is_audited,
    output_queues,
    processor_keys,
    queue_key,
)
from cues_platform.dagster.check_contract import evaluate
from cues_platform.dagster.check_memory import (
    ERROR_QUEUE,
    CheckMemory,
    Runs,
    count,
    describe,
    from_offsets,
    load_memory,
    plan_window,
    union,
)
from cues_platform.dagster.check_quarantine import quarantined_runs
from cues_platform.dagster.error_queues import error_counts, error_queue_writers
from cues_platform.dagster.materialize import latest_metadata
from cues_platform.dagster.resources import spark_session_of
from cues_platform.processing.contracts import contract_kind, rows_as_json
from cues_platform.processing.failures import Origin, origin_of_exception_type
from cues_platform.processing.graph import Graph, Processor
from cues_platform.queues import Lake, OffsetOutOfRangeError
from cues_platform.queues.schema import DELIVERY_HASH, OFFSET, RESERVED

MAX_LISTED = 20
CONTRACT = "contract"
EXACTLY_ONCE = "exactly_once"
OUTSIDE_PROTOCOL = "outside_protocol"
PLATFORM_ERRORS = "no_platform_errors"
RETAINED_AWAY = "retained_away"
# a read that retention overtook (a start offset moved between computing the readable ranges and
# reading them) is planned again on the new start offsets; each retry means a start moved forward
RETENTION_RACE_RETRIES = 5


# -- contracts ------------------------------------------------------------------------------------
def rows_at(lake: Lake, queue_name: str, ranges: Mapping[str, Sequence[int]], spark: Any, *,
            protocol_only: bool) -> Any:
    """The rows of ``ranges`` (``{partition: [start, end)}``), payload columns only: a Spark
    DataFrame, or a ``pyarrow.Table`` when ``spark`` is None. ``protocol_only``: only rows with a
    delivery hash (written by a processor step)."""
    queue = lake.queue(queue_name)
    payload = [c for c in queue.payload_schema.names if c not in RESERVED]
    if spark is None:
        import pyarrow as pa
        import pyarrow.compute as pc

        tables = [queue.read_arrow(partition=p, start=int(lo), end=int(hi)) for p, (lo, hi) in ranges.items()]
        if not tables:
            return queue.payload_schema.empty_table().select(payload)
        table = pa.concat_tables(tables)
        if protocol_only:
            table = table.filter(pc.is_valid(table[DELIVERY_HASH]))
        return table.select(payload)
    from functools import reduce

    from pyspark.sql import functions as F

    frames = [queue.read_spark(spark, partition=p, start=int(lo), end=int(hi)) for p, (lo, hi) in ranges.items()]
    if not frames:
        raise ValueError("rows_at on Spark needs at least one range")
    df = reduce(lambda a, b: a.unionByName(b), frames)
    if protocol_only:
        df = df.where(F.col(DELIVERY_HASH).isNotNull())
    return df.select(*payload)


class RangesNotRecorded(LookupError):
    """The asset's latest materialization has no ranges metadata (made by an older version).
    No check of this module judges from a materialization's ranges any more (both remember what
    they judged); kept for callers of :func:`latest_ranges`."""


def latest_ranges(context: AssetCheckExecutionContext, key: AssetKey, name: str) -> dict[str, list[int]] | None:
    """Ranges metadata ``name`` of the asset's latest materialization (None: never materialized);
    raises :class:`RangesNotRecorded` when that materialization did not record them."""
    metadata = latest_metadata(context.instance, key)
    if metadata is None:
        return None
    if metadata.get(name) is None:
        raise RangesNotRecorded(name)
    return {str(p): [int(lo), int(hi)] for p, (lo, hi) in dict(metadata[name]).items()}


def runs_without_hash(lake: Lake, queue_name: str, runs: Runs) -> Runs:
    """``{partition: [[start, end), ...]}``: the offsets of ``runs`` whose rows have no delivery
    hash (two columns read, no payload)."""
    import pyarrow.compute as pc

    queue = lake.queue(queue_name)
    found: dict[str, list[int]] = {}
    for part, spans in runs.items():
        for lo, hi in spans:
            table = queue.read_arrow(partition=part, start=int(lo), end=int(hi), columns=[OFFSET, DELIVERY_HASH])
            found.setdefault(part, []).extend(table.filter(pc.is_null(table[DELIVERY_HASH]))[OFFSET].to_pylist())
    return from_offsets(found)


def validate_contract(contract: Any, df: Any) -> tuple[bool, list[dict[str, Any]]]:
    """Validate rows (Spark DataFrame, Arrow table or pandas) with a pandera contract; returns
    (passed, failures)."""
    kind = contract_kind(contract)
    if kind == "pandas":
        import pandera.errors as pe

        frame = df.toPandas() if hasattr(df, "toPandas") else (
            df.to_pandas() if hasattr(df, "to_pandas") else df)
        schema = contract.to_schema() if isinstance(contract, type) else contract
        try:
            schema.validate(frame, lazy=True)
        except pe.SchemaErrors as exc:
            # every case (the metadata lists MAX_LISTED of them but counts them all); "index" is
            # the failing row, so a row-level check that pandera reports once per column counts once
            failures = [{"column": str(r.get("column")), "check": str(r.get("check")),
                         "failure_case": str(r.get("failure_case")), "index": _index(r.get("index"))}
                        for r in exc.failure_cases.to_dict("records")]
            return False, failures or [{"error": str(exc)[:500]}]
        except pe.SchemaError as exc:
            return False, [{"error": str(exc)[:500]}]
        return True, []
    out = contract.validate(check_obj=df) if isinstance(contract, type) else contract.validate(df)
    errors = getattr(getattr(out, "pandera", None), "errors", None) or {}
    failures = []
    for scope, by_reason in dict(errors).items():
        for reason, items in dict(by_reason).items():
            for item in items:
                failures.append({"scope": scope, "reason": reason, "column": str(item.get("column")),
                                 "check": str(item.get("check")), "error": str(item.get("error"))[:300]})
    return not failures, failures


def _index(value: Any) -> str | None:
    """A failure case's row index as text; None for schema-level failures (no row)."""
    import math

    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def failure_counts(failures: list[dict[str, Any]]) -> dict[str, Any]:
    """``failures``: one per failing (row, check), a row-level check reported once per column
    counted once; ``failing_rows``: distinct rows (None when the validator names no rows, as
    pandera.pyspark's summary does)."""
    rows = {f["index"] for f in failures if f.get("index") is not None}
    pairs = {(f.get("index"), f.get("check"), None if f.get("index") is not None else f.get("column"))
             for f in failures}
    named = any("index" in f for f in failures)
    return {"failures": len(pairs), "failing_rows": len(rows) if named else None}


# -- checks --------------------------------------------------------------------------------------
def check_specs(graph: Graph, proc: Processor, *, prefix: Sequence[str] = ()) -> list[AssetCheckSpec]:
    specs: list[AssetCheckSpec] = []
    keys = processor_keys(proc, prefix)
    queues = output_queues(proc)
    for key, q in zip(keys, queues or [None] * len(keys), strict=True):
        if q is not None and graph.queues[q].contract is not None:
            specs.append(AssetCheckSpec(
                CONTRACT, asset=key, blocking=True,
                description=f"pandera contract of queue {q!r} on every row that arrived since it last "
                            "judged, and on the rows it holds open until quarantined or passing"))
        if is_audited(proc):
            specs.append(AssetCheckSpec(EXACTLY_ONCE, asset=key, blocking=True,
                                        description="exactly-once audit (cues audit) of this output"))
            if q is not None:
                specs.append(AssetCheckSpec(
                    OUTSIDE_PROTOCOL, asset=key, blocking=False,
                    description=f"rows of {q!r} written outside the protocol (no delivery hash)"))
    return specs


def build_processor_checks(graph: Graph, proc: Processor, *, prefix: Sequence[str] = ()) -> Any | None:
    specs = check_specs(graph, proc, prefix=prefix)
    if not specs:
        return None
    keys = processor_keys(proc, prefix)
    queue_of = dict(zip(keys, output_queues(proc) or [None] * len(keys), strict=True))
    pid = proc.id

    @multi_asset_check(specs=specs, name=f"{pid}_checks", can_subset=True,
                       required_resource_keys={LAKE_KEY, SPARK_KEY},
                       description=f"contract and exactly-once checks of processor {pid!r}")
    def _checks(context: AssetCheckExecutionContext):
        lake = getattr(context.resources, LAKE_KEY).lake()
        selected = set(context.selected_asset_check_keys)
        report = None
        for spec in specs:
            ck = AssetCheckKey(spec.asset_key, spec.name)
            if ck not in selected:
                continue
            q = queue_of[spec.asset_key]
            if spec.name == CONTRACT:
                yield _contract_result(context, spec.asset_key, lake, q, graph.queues[q].contract,
                                       graph.error_queue_of(proc))
                continue
            if report is None:
                report = audit(lake, graph=graph)
            if spec.name == OUTSIDE_PROTOCOL:
                yield _outside_protocol_result(context, spec.asset_key, lake, q, graph.queues[q].contract,
                                               graph.error_queue_of(proc), report)
                continue
            lanes = set(graph.families.get(pid, [pid]))  # its lanes (itself without lanes)
            mine = [v for v in report.violations if v.kind != NO_DELIVERY_HASH
                    and (v.processor in lanes or (q is not None and v.queue == q))]
            summaries = {lane: report.processors[lane] for lane in sorted(lanes) if lane in report.processors}
            meta: dict[str, Any] = {
                "violations": len(mine),
                "by_kind": {k: sum(v.kind == k for v in mine) for k in sorted({v.kind for v in mine})},
                "lake_ok": report.ok,
            }
            if mine:
                meta["first_violations"] = "\n".join(v.to_text() for v in mine[:MAX_LISTED])
            if len(summaries) == 1:
                (summary,) = summaries.values()
                meta["steps_delivered"] = summary.steps_delivered
                meta["lag"] = summary.lag
                meta["pending"] = summary.pending or "none"
            elif summaries:  # by lane: the partition's steps, lag and pending attempt
                meta["steps_delivered"] = sum(x.steps_delivered for x in summaries.values())
                meta["lanes"] = {lane: {"steps_delivered": x.steps_delivered, "lag": x.lag,
                                        "pending": x.pending or "none"} for lane, x in summaries.items()}
            yield AssetCheckResult(asset_key=spec.asset_key, check_name=EXACTLY_ONCE,
                                   passed=not mine, severity=AssetCheckSeverity.ERROR,
                                   metadata=meta)

    return _checks


def _spark_for(context: AssetCheckExecutionContext, contract: Any) -> Any:
    return None if contract_kind(contract) == "pandas" else spark_session_of(getattr(context.resources, SPARK_KEY))


def _contract_result(context: AssetCheckExecutionContext, key: AssetKey, lake: Lake, q: str,
                     contract: Any, error_queue: str | None) -> AssetCheckResult:
    """Every row that arrived since the check last judged, and the rows it holds open
    (``check_contract``); its memory is its own previous evaluation (``check_memory``)."""
    memory = load_memory(context.instance, AssetCheckKey(key, CONTRACT))
    passed, red, meta = evaluate(lake, q, contract, memory=memory, error_queue=error_queue,
                                 spark=_spark_for(context, contract), validate=validate_contract,
                                 counts_of=failure_counts, retries=RETENTION_RACE_RETRIES)
    severity = AssetCheckSeverity.ERROR if red or passed else AssetCheckSeverity.WARN
    return AssetCheckResult(asset_key=key, check_name=CONTRACT, passed=passed, severity=severity,
                            metadata=meta)


def _outside_protocol_result(context: AssetCheckExecutionContext, key: AssetKey, lake: Lake, q: str,
                             contract: Any, error_queue: str | None, report: Any) -> AssetCheckResult:
    """Rows without a delivery hash among every row that arrived since the check last judged,
    and the ones it holds open until quarantined (``evaluate_outside``); its memory is its own
    previous evaluation (``check_memory``), as ``contract``'s is."""
    memory = load_memory(context.instance, AssetCheckKey(key, OUTSIDE_PROTOCOL))
    spark = _spark_for(context, contract) if contract is not None else None
    everywhere = [v for v in report.violations if v.kind == NO_DELIVERY_HASH and v.queue == q and v.offsets]
    passed, meta = evaluate_outside(lake, q, contract, memory=memory, error_queue=error_queue, spark=spark,
                                    retries=RETENTION_RACE_RETRIES)
    meta["rows_in_queue"] = sum(v.offsets[1] - v.offsets[0] for v in everywhere)
    return AssetCheckResult(asset_key=key, check_name=OUTSIDE_PROTOCOL, passed=passed,
                            severity=AssetCheckSeverity.WARN, metadata=meta)


def evaluate_outside(lake: Lake, q: str, contract: Any, *, memory: CheckMemory, error_queue: str | None,
                     spark: Any, retries: int) -> tuple[bool, dict[str, Any]]:
    """One ``outside_protocol`` evaluation: (passed, metadata with the new memory). A read that
    retention overtook is planned again (at most ``retries`` times)."""
    for attempt in range(retries):
        try:
            return _evaluate_outside(lake, q, contract, memory=memory, error_queue=error_queue, spark=spark)
        except OffsetOutOfRangeError:  # a start offset moved while reading: plan again
            if attempt == retries - 1:
                raise
    raise AssertionError("unreachable")


def _evaluate_outside(lake: Lake, q: str, contract: Any, *, memory: CheckMemory, error_queue: str | None,
                      spark: Any) -> tuple[bool, dict[str, Any]]:
    quarantined = quarantined_runs(lake, error_queue=error_queue, queue=q) if error_queue else {}
    window = plan_window(lake, q, memory=memory, quarantined=quarantined)
    found = runs_without_hash(lake, q, window.readable)  # open rows are read again: two columns
    new_memory = window.next_memory(found)
    open_rows, unjudged = new_memory.open_failing, new_memory.open_unjudged
    meta: dict[str, Any] = {
        "queue": q,
        "memory_from_run": window.memory.run_id or "none: judged from offset 0",
        "judged_ranges": window.readable,
        "arrived_ranges": window.arrived,
        "rows": count(union(found, window.still_failing_removed)),  # exact (the memory may be coalesced)
        "offsets": open_rows,
        "open_unjudged_rows": count(unjudged),
        "closed_by_quarantine_rows": count(window.closed_by_quarantine),
        **new_memory.metadata(),
        ERROR_QUEUE: error_queue or "",
    }
    if contract is not None and found:
        breaking = 0
        for part, spans in found.items():
            for span in spans:
                ok, failures = validate_contract(contract, rows_at(lake, q, {part: span}, spark, protocol_only=False))
                counted = failure_counts(failures)["failing_rows"] if not ok else 0
                breaking += counted if counted is not None else span[1] - span[0]
        meta["rows_breaking_the_contract"] = breaking
    if found:
        meta["rows_sample"] = rows_sample(lake, q, found)
    if open_rows:
        how = (f"`cues quarantine add {q} --check outside_protocol --all-open --reason ...` (or "
               f"-p PARTITION --offsets START:END) records them, with the reason, in error queue "
               f"{error_queue!r}" if error_queue else "the graph has no error queue to quarantine them in")
        meta["what_to_do"] = (f"rows at {describe(open_rows)} were appended without a delivery hash (not "
                              "by a processor step) and downstream processors read them like any row: "
                              f"find who wrote them, then quarantine them: {how}; the check stays failed "
                              "until then; see docs/dagster.md, 'From a red check to a green pipeline'")
    notes = list(window.notes)
    if unjudged:  # those rows were never looked at: never green on them
        meta[RETAINED_AWAY] = unjudged
        notes.append(f"never judged: the rows at {describe(unjudged)} were removed by the queue's retention "
                     "before any evaluation of this check read them; quarantine them (an "
                     "acknowledgement, no payload is left) to close them")
    if notes:
        meta["note"] = "; ".join(notes)
    return not open_rows and not unjudged, meta


def rows_sample(lake: Lake, q: str, runs: Runs, *, limit: int = MAX_LISTED) -> str:
    """A markdown table of the first ``limit`` rows of ``runs``: partition, offset, payload."""
    queue = lake.queue(q)
    payload = [c for c in queue.payload_schema.names if c not in RESERVED]
    lines = ["| partition | offset | payload |", "|---|---|---|"]
    left = limit
    for part, spans in sorted(runs.items()):
        for lo, hi in spans:
            if left <= 0:
                break
            table = queue.read_arrow(partition=part, start=lo, end=min(hi, lo + left))
            for offset, text in zip(table[OFFSET].to_pylist(), rows_as_json(table.select(payload)), strict=True):
                lines.append(f"| {part} | {offset} | {text} |")
            left -= table.num_rows
    return "\n".join(lines)


def build_error_queue_check(name: str, *, prefix: Sequence[str] = ()) -> Any:
    """``no_platform_errors`` on the error queue's asset: fails while the queue holds an error
    row whose exception type is the platform's (Delta, the file system, Py4J/Spark, ours): such a
    row was written by a failure that was never the user's (older versions filed them as the
    user's), and the step it names must be looked at (``cues audit`` reports it too)."""
    @asset_check(asset=queue_key(name, prefix), name=PLATFORM_ERRORS, required_resource_keys={LAKE_KEY},
                 description=f"no error row of {name!r} was written by a platform failure")
    def _check(context: AssetCheckExecutionContext) -> AssetCheckResult:
        lake = getattr(context.resources, LAKE_KEY).lake()
        found = {proc: {r: n for r, n in reasons.items() if origin_of_exception_type(r) is Origin.PLATFORM}
                 for proc, reasons in error_counts(lake, name).items()}
        found = {proc: reasons for proc, reasons in found.items() if reasons}
        rows = sum(sum(r.values()) for r in found.values())
        return AssetCheckResult(
            passed=rows == 0, severity=AssetCheckSeverity.ERROR,
            metadata={"queue": name, "platform_error_rows": rows, "by_processor": found,
                      "what_to_do": "each row names its processor, step and inputs; run `cues audit` "
                                    "and see docs/auditor.md (platform_error)" if rows else ""})

    return _check


def build_checks(graph: Graph, *, prefix: Sequence[str] = ()) -> list[Any]:
    out = []
    for pid in graph.family_order():
        c = build_processor_checks(graph, graph.as_declared(pid), prefix=prefix)
        if c is not None:
            out.append(c)
    external = set(external_queues(graph))
    out += [build_error_queue_check(name, prefix=prefix)
            for name in error_queue_writers(graph) if name not in external]
    return out


__all__ = ["CONTRACT", "EXACTLY_ONCE", "OUTSIDE_PROTOCOL", "PLATFORM_ERRORS", "build_checks",
           "build_processor_checks", "queue_key", "rows_at", "validate_contract"]
