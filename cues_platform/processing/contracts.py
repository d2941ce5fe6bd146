"""Data contracts: a pandera schema per queue (``QueueDef.contract``), of one of two kinds.

- ``pandera.pandas`` (``DataFrameSchema`` or ``DataFrameModel``): checked row by row inside the
  step. The step already materializes each output batch to Arrow once (step 3 of the protocol);
  the contract validates that batch lazily, and rows that break it are split off with the names
  of the checks they failed, to be delivered to the error queue in the same attempt as the good
  rows.
- ``pandera.pyspark``: evaluated on Spark frames by the Dagster ``contract`` check, on the rows
  each materialization wrote (``cues_platform.dagster.checks``); the step does not check it.
  pandera's pyspark backend reports failures per check, not per row, so it cannot route single
  rows: it fits queues whose rows a step must never produce broken (an assertion on the step's
  output), not the filtering of bad input.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pyarrow as pa

from cues_platform.queues.errors import SchemaError


def contract_kind(contract: Any) -> str:
    """'pandas', 'pyspark', or 'other' (anything with ``validate``, tried on Spark)."""
    mod = type(contract).__module__ if not isinstance(contract, type) else contract.__module__
    if isinstance(contract, type):
        from pandera.api.pandas.model import DataFrameModel as PandasModel
        from pandera.api.pyspark.model import DataFrameModel as SparkModel

        if issubclass(contract, SparkModel):
            return "pyspark"
        if issubclass(contract, PandasModel):
            return "pandas"
    if "pyspark" in mod:
        return "pyspark"
    if "pandas" in mod:
        return "pandas"
    return "other"


def checked_in_step(contract: Any) -> bool:
    """Whether the step routes the rows that break ``contract`` (pandas contracts only)."""
    return contract is not None and contract_kind(contract) == "pandas"


def _schema(contract: Any) -> Any:
    return contract.to_schema() if hasattr(contract, "to_schema") else contract


def split_by_contract(table: pa.Table, contract: Any, *, queue: str) -> tuple[pa.Table, pa.Table, list[str]]:
    """Return ``(good rows, bad rows, reasons per bad row)``.

    A failure that is not about particular rows (a missing column, a wrong dtype) raises
    :class:`SchemaError`: the whole batch breaks the contract.
    """
    if contract is None or table.num_rows == 0:
        return table, table.slice(0, 0), []
    import pandera.errors as pe

    frame = table.to_pandas()
    try:
        _schema(contract).validate(frame, lazy=True)
        return table, table.slice(0, 0), []
    except pe.SchemaErrors as exc:
        cases = exc.failure_cases
    reasons: dict[int, list[str]] = defaultdict(list)
    for row in cases.to_dict("records"):
        index = row.get("index")
        if index is None or index != index:  # None or NaN: not a row-level failure
            raise SchemaError(
                f"queue {queue!r}: the batch breaks the contract as a whole: {row.get('column')} "
                f"{row.get('check')} ({row.get('failure_case')})",
                queue=queue,
                check=str(row.get("check")),
            )
        reasons[int(index)].append(f"{row.get('column')}: {row.get('check')} (got {row.get('failure_case')!r})")
    bad = sorted(reasons)
    good_idx = [i for i in range(table.num_rows) if i not in reasons]
    return table.take(pa.array(good_idx, pa.int64())), table.take(pa.array(bad, pa.int64())), [
        "; ".join(reasons[i]) for i in bad
    ]


def rows_as_json(table: pa.Table) -> list[str]:
    return [json.dumps(r, default=str, sort_keys=True) for r in table.to_pylist()]
