"""``CuesIOManager``'s load path: a processor output read as a queue (Spark, Arrow or pandas by
the input's annotation), and a plain asset's Delta table read back; plain writes replace the table.

(No ``from __future__ import annotations``: Dagster reads the input annotations at definition.)
"""

import pandas as pd
import pyarrow as pa
from dagster import AssetKey, asset, materialize
from deltalake import DeltaTable
from pyspark.sql import DataFrame

from cues_platform.dagster.io_manager import asset_table_uri
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.graphs import expected, load_orders

SEEN: dict[str, object] = {}


@asset(io_manager_key="cues_io_manager")
def enriched_ids(enriched: DataFrame) -> DataFrame:
    """A Spark DataFrame of the processor output ``enriched`` (read_committed, all partitions)."""
    SEEN["spark"] = type(enriched)
    return enriched.select("id")


@asset(io_manager_key="cues_io_manager")
def enriched_count(enriched: pa.Table) -> pa.Table:
    SEEN["arrow"] = type(enriched)
    return pa.table({"rows": [enriched.num_rows], "delivered": [enriched["_delivery_hash"].null_count == 0]})


@asset(io_manager_key="cues_io_manager")
def enriched_notes(enriched: pd.DataFrame) -> pd.DataFrame:
    SEEN["pandas"] = type(enriched)
    return enriched[["id", "note"]].sort_values("id")


@asset(io_manager_key="cues_io_manager")
def ids_again(enriched_ids: DataFrame) -> None:
    """Reads the plain asset ``enriched_ids`` back from its Delta table as Spark."""
    SEEN["plain"] = sorted(r["id"] for r in enriched_ids.collect())


PLAIN = [enriched_ids, enriched_count, enriched_notes, ids_again]


def test_processor_output_loads_as_spark_arrow_and_pandas(defs, lake, instance) -> None:
    load_orders(lake)
    SEEN.clear()
    keys = [AssetKey("enriched"), *(a.key for a in PLAIN)]
    result = materialize([*assets_of(defs), *PLAIN], resources=resources_of(defs),
                         instance=instance, selection=keys)
    assert result.success
    assert issubclass(SEEN["spark"], DataFrame)
    assert SEEN["arrow"] is pa.Table and SEEN["pandas"] is pd.DataFrame
    doubled = expected()["enriched"]
    assert SEEN["plain"] == doubled
    table = DeltaTable(asset_table_uri(lake, ["enriched_ids"])).to_pyarrow_table()
    assert sorted(table["id"].to_pylist()) == doubled
    count = DeltaTable(asset_table_uri(lake, ["enriched_count"])).to_pyarrow_table().to_pylist()
    assert count == [{"rows": 30, "delivered": True}]
    notes = DeltaTable(asset_table_uri(lake, ["enriched_notes"])).to_pandas()
    assert list(notes.columns) == ["id", "note"] and len(notes) == 30

    # a rerun of a plain unpartitioned asset replaces its table: never doubled
    again = materialize([*assets_of(defs), *PLAIN], resources=resources_of(defs), instance=instance,
                        selection=[AssetKey("enriched_ids")])
    assert again.success
    dt = DeltaTable(asset_table_uri(lake, ["enriched_ids"]))
    assert dt.to_pyarrow_table().num_rows == 30
    history = dt.history(1)[0]
    assert history["dagster.run_id"] == again.run_id and history["dagster.asset"] == "enriched_ids"
