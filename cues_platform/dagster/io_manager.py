"""The IO manager of plain (non-processor) assets that produce or consume queue-like data.

``load_input`` gives the upstream asset as a Spark DataFrame: a processor's output queue is read
read_committed over all its partitions (``Queue.read_spark``: Spark reads the Parquet files
itself); a plain asset written by this IO manager is read from its Delta table. An input
annotated ``pyarrow.Table`` or ``pandas.DataFrame`` gets that type instead.

``handle_output`` writes a ``pyarrow.Table``, a pandas or a Spark DataFrame to the Delta table
``{lake}/assets/{asset key path}`` in ONE delta-rs commit. For a partitioned asset the commit
atomically REPLACES the rows of the run's partition(s) and nothing else
(``write_deltalake(mode="overwrite", predicate="<column> = '<key>'")``): a rerun or a backfill of
a daily partition gives the same rows, never doubled, and never touches other days. Each commit
carries the run id, the asset and the partition(s) as commit metadata (``DeltaTable.history()``).

Why not dagster-deltalake's IO manager: it takes only static commit metadata, and when building
its partition predicate fails it can overwrite the whole table (dagster issue 34064).
"""

import contextlib
from typing import Any

import pyarrow as pa
from dagster import ConfigurableIOManager, InputContext, OutputContext, ResourceDependency
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from cues_platform.dagster.resources import LakeResource, spark_session_of
from cues_platform.errors import ConfigurationError
from cues_platform.queues import Lake
from cues_platform.queues.names import join_uri

PARTITION_COLUMN = "partition_key"
PARTITION_COLUMN_METADATA = "cues/partition_column"  # asset metadata: use another column name
QUEUE_METADATA = "cues/queue"  # asset metadata of processor outputs: the queue behind the asset


def asset_table_uri(lake: Lake, path: list[str] | tuple[str, ...]) -> str:
    return join_uri(lake.root, "assets", *path)


def to_arrow_table(obj: Any) -> pa.Table:
    if isinstance(obj, pa.Table):
        return obj
    if isinstance(obj, pa.RecordBatch):
        return pa.Table.from_batches([obj])
    if hasattr(obj, "toArrow"):  # Spark DataFrame (classic or Connect)
        return obj.toArrow()
    if hasattr(obj, "to_dict") and hasattr(obj, "columns"):  # pandas
        return pa.Table.from_pandas(obj, preserve_index=False)
    raise TypeError(f"the cues IO manager writes pyarrow Tables, pandas or Spark DataFrames, "
                    f"not {type(obj).__name__}")


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def partition_predicate(column: str, keys: list[str]) -> str:
    if not keys:
        raise ConfigurationError("a partitioned write needs at least one partition key")
    if len(keys) == 1:
        return f"{column} = {_quote(keys[0])}"
    return f"{column} IN ({', '.join(_quote(k) for k in keys)})"


def _metadata_of(context: OutputContext | InputContext) -> dict[str, Any]:
    return dict(context.definition_metadata or {})


class CuesIOManager(ConfigurableIOManager):
    """Plain assets as Delta tables under ``{lake}/assets/``; processor outputs read as queues."""

    lake: ResourceDependency[LakeResource]
    spark: ResourceDependency[Any]

    # -- writing ------------------------------------------------------------------------------
    def handle_output(self, context: OutputContext, obj: Any) -> None:
        if obj is None:
            return
        lake = self.lake.lake()
        table = to_arrow_table(obj)
        path = list(context.asset_key.path)
        uri = asset_table_uri(lake, path)
        custom = {"dagster.run_id": context.run_id, "dagster.asset": "/".join(path)}
        partitioned = context.has_asset_partitions
        column = _metadata_of(context).get(PARTITION_COLUMN_METADATA, PARTITION_COLUMN)
        keys: list[str] = []
        if partitioned:
            keys = [str(k) for k in context.asset_partition_keys]
            table = _with_partition_column(table, column, keys)
            custom["dagster.partitions"] = ",".join(keys)
        props = CommitProperties(custom_metadata=custom)
        options = lake.options
        if partitioned:
            _ensure_table(uri, table.schema, [column], options)
            write_deltalake(uri, table, mode="overwrite", predicate=partition_predicate(column, keys),
                            commit_properties=props, storage_options=options)
        else:
            write_deltalake(uri, table, mode="overwrite", commit_properties=props,
                            storage_options=options)
        version = DeltaTable(uri, storage_options=options).version()
        meta: dict[str, Any] = {"uri": uri, "rows": table.num_rows, "delta_version": version}
        if partitioned:
            meta["partition_column"] = column
            meta["replaced_partitions"] = ", ".join(keys)
        context.add_output_metadata(meta)

    # -- reading ------------------------------------------------------------------------------
    def load_input(self, context: InputContext) -> Any:
        lake = self.lake.lake()
        upstream = context.upstream_output
        key = context.asset_key
        queue_name = None
        if upstream is not None:
            queue_name = _metadata_of(upstream).get(QUEUE_METADATA)
        uri = asset_table_uri(lake, list(key.path))
        if (queue_name is None and not DeltaTable.is_deltatable(uri, storage_options=lake.options)
                and lake.has_queue(key.path[-1])):
            queue_name = key.path[-1]
        wanted = getattr(context.dagster_type, "typing_type", None)
        if queue_name is not None:
            return self._load_queue(lake, queue_name, wanted)
        return self._load_table(context, lake, uri, wanted)

    def _session(self) -> Any:
        return spark_session_of(self.spark)

    def _load_queue(self, lake: Lake, name: str, wanted: Any) -> Any:
        queue = lake.queue(name)
        if wanted is pa.Table or _is_pandas(wanted):
            table = pa.concat_tables([queue.read_arrow(partition=p) for p in queue.partitions])
            return table.to_pandas() if _is_pandas(wanted) else table
        spark = self._session()
        frames = [queue.read_spark(spark, partition=p) for p in queue.partitions]
        out = frames[0]
        for frame in frames[1:]:
            out = out.unionByName(frame)
        return out

    def _load_table(self, context: InputContext, lake: Lake, uri: str, wanted: Any) -> Any:
        try:
            dt = DeltaTable(uri, storage_options=lake.options)
        except TableNotFoundError as exc:
            raise ConfigurationError(
                f"asset {context.asset_key.to_user_string()} has no table at {uri}: materialize it "
                "first", uri=uri) from exc
        table = dt.to_pyarrow_table()
        if context.has_asset_partitions:
            column = PARTITION_COLUMN
            if context.upstream_output is not None:
                column = _metadata_of(context.upstream_output).get(PARTITION_COLUMN_METADATA, column)
            if column in table.column_names:
                import pyarrow.compute as pc

                keys = pa.array([str(k) for k in context.asset_partition_keys], pa.string())
                table = table.filter(pc.is_in(table[column].cast(pa.string()), value_set=keys))
        if wanted is pa.Table:
            return table
        if _is_pandas(wanted):
            return table.to_pandas()
        return self._session().createDataFrame(table)


def _is_pandas(t: Any) -> bool:
    return getattr(t, "__module__", "").startswith("pandas") and getattr(t, "__name__", "") == "DataFrame"


def _with_partition_column(table: pa.Table, column: str, keys: list[str]) -> pa.Table:
    if column in table.column_names:
        import pyarrow.compute as pc

        values = table[column].cast(pa.string())
        outside = pc.invert(pc.is_in(values, value_set=pa.array(keys, pa.string())))
        if table.num_rows and pc.any(outside).as_py():
            raise ConfigurationError(
                f"the output's column {column!r} holds values outside this run's partition(s) "
                f"{keys}: a partitioned write replaces exactly its own partitions", column=column)
        idx = table.column_names.index(column)
        return table.set_column(idx, pa.field(column, pa.string()), values)
    if len(keys) != 1:
        raise ConfigurationError(
            f"a run over several partitions ({len(keys)}) must return a column {column!r} naming "
            "each row's partition (or set the asset metadata "
            f"{PARTITION_COLUMN_METADATA!r} to the column that does)", column=column)
    return table.append_column(pa.field(column, pa.string()),
                               pa.array([keys[0]] * table.num_rows, pa.string()))


def _ensure_table(uri: str, schema: pa.Schema, partition_by: list[str],
                  options: dict[str, str] | None) -> None:
    if DeltaTable.is_deltatable(uri, storage_options=options):
        return
    # created concurrently by another run: the overwrite that follows works on it
    with contextlib.suppress(CommitFailedError):
        DeltaTable.create(uri, schema, mode="ignore", partition_by=partition_by,
                          storage_options=options)
