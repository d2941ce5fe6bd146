"""Asset checks on processor outputs, blocking: a failed check stops downstream assets in the run.

- ``contract``: the queue's pandera contract (``QueueDef.contract``) on its latest rows (up to
  ``CONTRACT_SAMPLE_ROWS`` per partition, payload columns only). A ``pandera.pandas`` contract
  (what the step checks row by row, see ``cues_platform.processing.contracts``) is validated on
  those rows read as Arrow -> pandas (``lazy=True``: every failure listed); a ``pandera.pyspark``
  contract (``DataFrameSchema`` / ``DataFrameModel``) validates the Spark DataFrame where it is
  and reports in ``df.pandera.errors``.
- ``exactly_once``: ``cues_platform.audit.audit(lake)``; fails on any violation in this queue or
  of this processor (gaps, overlaps, rows delivered twice, unknown hashes, ...).

Rows that break a contract *inside* a step go to the error queue (the processing layer); this
check shows the status of what is in the queue.
"""

import json
from collections.abc import Sequence
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    asset_check,
    multi_asset_check,
)

from cues_platform.dagster.assets import (
    LAKE_KEY,
    SPARK_KEY,
    is_audited,
    output_queues,
    processor_keys,
    queue_key,
)
from cues_platform.dagster.resources import spark_session_of
from cues_platform.processing.graph import Graph, Processor
from cues_platform.queues import Lake
from cues_platform.queues.schema import RESERVED

CONTRACT_SAMPLE_ROWS = 10_000
MAX_LISTED = 20
CONTRACT = "contract"
EXACTLY_ONCE = "exactly_once"
PLATFORM_ERRORS = "no_platform_errors"


# -- contracts ------------------------------------------------------------------------------------
def _kind_of(contract: Any) -> str:
    """'pyspark' or 'pandas' (or 'other': anything with ``validate``, tried on Spark)."""
    mod = type(contract).__module__ if not isinstance(contract, type) else contract.__module__
    if isinstance(contract, type):
        try:
            from pandera.api.pyspark.model import DataFrameModel as SparkModel

            if issubclass(contract, SparkModel):
                return "pyspark"
        except ImportError:  # pragma: no cover
            pass
        try:
            from pandera.api.pandas.model import DataFrameModel as PandasModel

            if issubclass(contract, PandasModel):
                return "pandas"
        except ImportError:  # pragma: no cover
            pass
    if "pyspark" in mod:
        return "pyspark"
    if "pandas" in mod:
        return "pandas"
    return "other"


def latest_rows(lake: Lake, queue_name: str, spark: Any, *, rows: int = CONTRACT_SAMPLE_ROWS) -> Any:
    """The newest ``rows`` messages of every partition, payload columns only: a Spark DataFrame,
    or a ``pyarrow.Table`` when ``spark`` is None."""
    queue = lake.queue(queue_name)
    if spark is None:
        import pyarrow as pa

        tables = [queue.read_arrow(partition=p, start=max(0, end - rows), end=end)
                  for p, end in queue.end_offsets().items()]
        table = pa.concat_tables(tables)
        return table.select([c for c in table.column_names if c not in RESERVED])
    frames = []
    for part, end in queue.end_offsets().items():
        frames.append(queue.read_spark(spark, partition=part, start=max(0, end - rows), end=end))
    df = frames[0]
    for f in frames[1:]:
        df = df.unionByName(f)
    return df.select(*[c for c in df.columns if c not in RESERVED])


def validate_contract(contract: Any, df: Any) -> tuple[bool, list[dict[str, Any]]]:
    """Validate rows (Spark DataFrame, Arrow table or pandas) with a pandera contract; returns
    (passed, failures)."""
    kind = _kind_of(contract)
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
            specs.append(AssetCheckSpec(CONTRACT, asset=key, blocking=True,
                                        description=f"pandera contract of queue {q!r} on its latest rows"))
        if is_audited(proc):
            specs.append(AssetCheckSpec(EXACTLY_ONCE, asset=key, blocking=True,
                                        description="exactly-once audit (cues audit) of this output"))
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
                contract = graph.queues[q].contract
                spark = (None if _kind_of(contract) == "pandas"
                         else spark_session_of(getattr(context.resources, SPARK_KEY)))
                df = latest_rows(lake, q, spark)
                passed, failures = validate_contract(contract, df)
                yield AssetCheckResult(
                    asset_key=spec.asset_key, check_name=CONTRACT, passed=passed,
                    severity=AssetCheckSeverity.ERROR,
                    metadata={"queue": q, "sample_rows_per_partition": CONTRACT_SAMPLE_ROWS,
                              **{k: v for k, v in failure_counts(failures).items() if v is not None},
                              "failed_checks": sorted({f"{f.get('column')}: {f.get('check')}" for f in failures}),
                              "details": json.dumps(failures[:MAX_LISTED], default=str)})
            else:
                if report is None:
                    from cues_platform.audit import audit

                    report = audit(lake, graph=graph)
                mine = [v for v in report.violations
                        if v.processor == pid or (q is not None and v.queue == q)]
                summary = report.processors.get(pid)
                meta: dict[str, Any] = {
                    "violations": len(mine),
                    "by_kind": {k: sum(v.kind == k for v in mine) for k in sorted({v.kind for v in mine})},
                    "lake_ok": report.ok,
                }
                if mine:
                    meta["first_violations"] = "\n".join(v.to_text() for v in mine[:MAX_LISTED])
                if summary is not None:
                    meta["steps_delivered"] = summary.steps_delivered
                    meta["lag"] = summary.lag
                    meta["pending"] = summary.pending or "none"
                yield AssetCheckResult(asset_key=spec.asset_key, check_name=EXACTLY_ONCE,
                                       passed=not mine, severity=AssetCheckSeverity.ERROR,
                                       metadata=meta)

    return _checks


def build_error_queue_check(name: str, *, prefix: Sequence[str] = ()) -> Any:
    """``no_platform_errors`` on the error queue's asset: fails while the queue holds an error
    row whose exception type is the platform's (Delta, the file system, Py4J/Spark, ours): such a
    row was written by a failure that was never the user's (older versions filed them as the
    user's), and the step it names must be looked at (``cues audit`` reports it too)."""
    from cues_platform.dagster.error_queues import error_counts
    from cues_platform.processing.failures import Origin, origin_of_exception_type

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
    from cues_platform.dagster.assets import external_queues
    from cues_platform.dagster.error_queues import error_queue_writers

    out = []
    for pid in graph.topological_order():
        c = build_processor_checks(graph, graph.processors[pid], prefix=prefix)
        if c is not None:
            out.append(c)
    external = set(external_queues(graph))
    out += [build_error_queue_check(name, prefix=prefix)
            for name in error_queue_writers(graph) if name not in external]
    return out


__all__ = ["CONTRACT", "EXACTLY_ONCE", "PLATFORM_ERRORS", "build_checks", "build_processor_checks", "latest_rows",
           "queue_key", "validate_contract"]
