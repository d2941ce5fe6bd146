"""Bad input gets a typed error that says what was wrong, and leaves nothing behind."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cues_platform.queues import (
    BatchError,
    InvalidNameError,
    NullValueError,
    QueueExistsError,
    QueueNotFoundError,
    ReservedColumnError,
    SchemaError,
    UnknownPartitionError,
)
from cues_platform.queues.maintenance import vacuum
from tests.support import PAYLOAD, rows


@pytest.mark.parametrize("name", ["../etc", "a/b", "..", "", "a b", "x" * 200, ".hidden", "é"])
def test_bad_queue_names_are_refused(lake, name) -> None:
    with pytest.raises(InvalidNameError) as info:
        lake.create_queue(name, schema=PAYLOAD)
    assert "invalid queue name" in str(info.value)


def test_bad_partition_names_are_refused(lake) -> None:
    with pytest.raises(InvalidNameError):
        lake.create_queue("q", schema=PAYLOAD, partitions=["../x"])


def test_only_delta_table_properties_may_be_set(lake) -> None:
    from cues_platform.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"only delta\.\* table properties"):
        lake.create_queue("q", schema=PAYLOAD, properties={"cues.partitions": "[]"})
    assert not lake.has_queue("q")
    q = lake.create_queue("q", schema=PAYLOAD, properties={"delta.logRetentionDuration": "interval 2 days"})
    assert q.refresh().metadata().configuration["delta.logRetentionDuration"] == "interval 2 days"


def test_payload_column_named_like_metadata_is_refused(lake) -> None:
    with pytest.raises(ReservedColumnError) as info:
        lake.create_queue("q", schema=pa.schema([("_offset", pa.int64())]))
    assert info.value.column == "_offset"


def test_schema_mismatch_names_the_columns(make_queue) -> None:
    q = make_queue()
    with pytest.raises(SchemaError) as info:
        q.append({"id": [1], "other": ["x"]}, partition="0")
    assert info.value.missing == ["note"] and info.value.unexpected == ["other"]
    with pytest.raises(SchemaError) as info:
        q.append({"id": ["one"], "note": ["x"]}, partition="0")
    assert info.value.column == "id"


def test_safe_casts_are_accepted(make_queue) -> None:
    q = make_queue()
    q.append(pa.table({"id": pa.array([1], pa.int32()), "note": ["x"]}), partition="0")
    assert q.read_arrow(partition="0")["id"].type == pa.int64()


def test_nulls_in_required_columns_are_refused(make_queue) -> None:
    q = make_queue()
    with pytest.raises(NullValueError) as info:
        q.append({"id": [1, None], "note": ["a", "b"]}, partition="0")
    assert info.value.column == "id" and info.value.row == 1
    assert q.count() == 0


def test_reserved_columns_in_a_batch_are_refused(make_queue) -> None:
    q = make_queue()
    with pytest.raises(ReservedColumnError):
        q.append({"id": [1], "note": ["a"], "_offset": [7]}, partition="0")


def test_empty_and_oversized_batches_are_refused(make_queue) -> None:
    q = make_queue(max_batch_rows=5)
    with pytest.raises(BatchError, match="empty"):
        q.append(rows(0, 0), partition="0")
    with pytest.raises(BatchError) as info:
        q.append(rows(0, 6), partition="0")
    assert info.value.limit == 5 and info.value.rows == 6


def test_unknown_partition_is_refused_until_added(make_queue) -> None:
    q = make_queue(partitions=("a",))
    with pytest.raises(UnknownPartitionError) as info:
        q.append(rows(0, 1), partition="b")
    assert "add it with Queue.add_partitions" in str(info.value)
    q.add_partitions(["b"])
    assert q.append(rows(0, 1), partition="b").first_offset == 0


def test_missing_queue_and_conflicting_redefinition(lake, make_queue) -> None:
    with pytest.raises(QueueNotFoundError):
        lake.queue("nope")
    make_queue()
    with pytest.raises(QueueExistsError):
        lake.create_queue("events", schema=pa.schema([("other", pa.string())]), exist_ok=True)
    assert lake.create_queue("events", schema=PAYLOAD, exist_ok=True).name == "events"
    assert lake.list_queues() == ["events"]


def test_failed_commit_leaves_no_rows_and_no_files_after_vacuum(make_queue) -> None:
    from pathlib import Path

    from cues_platform.queues.appender import append_batches
    from cues_platform.queues.errors import ConcurrentAppendError

    q = make_queue()
    q.append(rows(0, 1), partition="0")
    before = {p for p in Path(q.uri).rglob("*.parquet")}

    # A writer that always loses the race: its commit keeps hitting the same app id as a rival's.
    def rival(dt):
        from deltalake import CommitProperties, Transaction, write_deltalake

        write_deltalake(
            dt.table_uri,
            q.table_schema.empty_table(),
            mode="append",
            commit_properties=CommitProperties(app_transactions=[Transaction("part:0", 1)]),
        )

    with pytest.raises(ConcurrentAppendError):
        append_batches(q, {"0": rows(1, 3)}, guards=[lambda dt: rival(dt)], max_attempts=3)
    assert q.read_arrow(partition="0")["id"].to_pylist() == [0]
    leaked = {p for p in Path(q.uri).rglob("*.parquet")} - before
    assert leaked, "the lost commits should have left orphan files for vacuum to find"
    vacuum(q, retention_hours=0, unsafe_allow_short_retention=True)
    assert {p for p in Path(q.uri).rglob("*.parquet")} == before


def test_demo_lake_reset_deletes_only_a_lake(tmp_path) -> None:
    from cues_platform.errors import ConfigurationError
    from cues_platform.queues import Lake
    from cues_platform.queues.location import reset_local_lake

    reset_local_lake(tmp_path / "missing")  # nothing there: nothing to do
    lake_dir = tmp_path / "lake"
    Lake(root=str(lake_dir)).create_queue("q", schema=PAYLOAD)
    reset_local_lake(lake_dir)
    assert not lake_dir.exists()
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    with pytest.raises(ConfigurationError, match="refusing to delete .*thesis.tex"):
        reset_local_lake(home)
    assert (home / "thesis.tex").read_text() == "years of work"
