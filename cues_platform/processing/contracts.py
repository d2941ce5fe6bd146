"""Data contracts: a pandera schema per queue, checked row by row inside the step.

The contract is a ``pandera.pandas`` ``DataFrameSchema`` (or ``DataFrameModel``). The step already
materializes each output batch to Arrow once (step 3 of the protocol); the contract validates that
batch lazily, and rows that break it are split off with the names of the checks they failed, to
be delivered to the error queue in the same attempt as the good rows. pandera's pyspark backend
reports failures per check rather than per row, which cannot route single rows; it is used for
whole-queue asset checks in the Dagster layer instead.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pyarrow as pa

from cues_platform.queues.errors import SchemaError


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
