"""Issue 22 item 7: nothing outside the lake is read or written by recovery, staging or commits.

The review forged an attempt record in a backing queue naming a Parquet file outside the lake
(``/tmp/evil.parquet``); recovery appended its rows to an output queue, for a step that read the
empty range [15, 15). Here the same record is forged (``BackingQueue.append``, as the review did)
and recovery must refuse with :class:`PathOutsideLakeError` (a platform error: no error row),
naming the file and the record, with no row added anywhere. No Spark: recovery reads no input.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cues_platform.errors import CuesError
from cues_platform.processing import BackingQueue, Graph, In, Kind, Out, Processor, QueueDef
from cues_platform.processing.backing import Range, Record, RecordType, Snapshot
from cues_platform.processing.failures import (
    Origin,
    Phase,
    origin_of,
    origin_of_exception_type,
    qualified_name,
)
from cues_platform.processing.home import commit_step, fence_home
from cues_platform.processing.outputs import ERROR_SCHEMA, read_staged, stage
from cues_platform.processing.runner import create_queues
from cues_platform.processing.step import ExactlyOnceStepper
from cues_platform.queues import Lake
from cues_platform.queues.confine import PathOutsideLakeError, confine, is_inside
from cues_platform.queues.errors import QueueError

ROWS = pa.schema([pa.field("id", pa.int64())])


def graph() -> Graph:
    return Graph.build(
        name="confine",
        queues=[QueueDef("a", ROWS), QueueDef("b", ROWS), QueueDef("c", ROWS),
                QueueDef("errors", ERROR_SCHEMA)],
        processors=[Processor("p", Kind.FORK, lambda ctx, a: None, {"a": In("a")},
                              {"b": Out("b"), "c": Out("c")})],
        error_queue="errors",
    )  # fmt: skip


def delivered_15(lake: Lake) -> tuple[Graph, int]:
    """Lake where ``p`` delivered a/0 [0, 15) in one step (home queue b); returns the epoch."""
    g = graph()
    create_queues(g, lake)
    lake.queue("a").append(pa.table({"id": list(range(15))}, schema=ROWS), partition="0")
    epoch = BackingQueue(lake, "p").fence()
    assert fence_home(lake.queue("b"), "p", epoch) is None
    first = Snapshot("p", 0, {"a": Range("a", "0", 0, 15)})
    commit_step(lake.queue("b"), first, {}, epoch=epoch, outcome=RecordType.ATTEMPT_NIL, rows={},
                is_record=True)
    return g, epoch


def forge(lake: Lake, epoch: int, files: dict[str, dict[str, str]]) -> Snapshot:
    """The review's record: step 1 read the empty range [15, 15) and "produced" one row."""
    snapshot = Snapshot("p", 1, {"a": Range("a", "0", 15, 15)})
    rows = {q: dict.fromkeys(parts, 1) for q, parts in files.items()}
    BackingQueue(lake, "p").append(
        Record(RecordType.ATTEMPT_OUTPUT, snapshot, epoch, {"files": files, "rows": rows}))
    return snapshot


def evil(path: Path) -> str:
    pq.write_table(pa.table({"id": [666]}, schema=ROWS), path)
    return str(path)


def row_counts(lake: Lake) -> dict[str, int]:
    return {q: lake.queue(q).read_arrow(partition="0").num_rows for q in ("b", "c", "errors")}


def recover(lake: Lake, g: Graph) -> object:
    return ExactlyOnceStepper(graph=g, processor=g.processors["p"], lake=lake).recover()


@pytest.mark.parametrize("queue", ["b", "c"])  # b: the home (read_staged), c: commit_staged
def test_forged_attempt_naming_a_file_outside_the_lake_is_refused(
    tmp_path: Path, queue: str
) -> None:
    lake = Lake(root=str(tmp_path / "lake"))
    g, epoch = delivered_15(lake)
    outside = evil(tmp_path / "evil.parquet")
    snapshot = forge(lake, epoch, {queue: {"0": outside}})
    before = row_counts(lake)
    with pytest.raises(PathOutsideLakeError) as info:
        recover(lake, g)
    err = info.value
    assert isinstance(err, QueueError) and isinstance(err, CuesError) and not err.retryable
    assert outside in str(err) and err.path == outside
    assert "cues audit" in str(err)
    # both reads know the attempt (commit_staged, and the home read in step.py): the record is named
    assert "attempt record of step 1 of processor 'p'" in str(err)
    assert snapshot.delivery_hash in str(err) and (err.step, err.queue) == (1, queue)
    assert row_counts(lake) == before  # no row in b or c, and no error row
    with pytest.raises(PathOutsideLakeError):  # every later start refuses again, never appends
        recover(lake, g)
    assert row_counts(lake) == before


def test_staged_file_of_another_step_or_a_symlink_out_of_the_lake_is_refused(tmp_path: Path) -> None:
    lake = Lake(root=str(tmp_path / "lake"))
    g, epoch = delivered_15(lake)
    snapshot = Snapshot("p", 1, {"a": Range("a", "0", 15, 15)})
    # inside the lake, but in the staging folder of another step: not this attempt's file
    other = stage(lake, Snapshot("p", 7, {"a": Range("a", "0", 0, 1)}),
                  {"c": {"0": pa.table({"id": [7]}, schema=ROWS)}})["c"]["0"]
    # in this step's own staging folder, but a symlink to a file outside the lake
    mine = stage(lake, snapshot, {"c": {"0": pa.table({"id": [1]}, schema=ROWS)}})["c"]["0"]
    link = Path(mine).with_name("c--0--link.parquet")
    os.symlink(evil(tmp_path / "evil.parquet"), link)
    for named in (other, str(link)):
        with pytest.raises(PathOutsideLakeError, match="refusing file"):
            read_staged({"0": named}, lake.options, lake=lake, snapshot=snapshot, queue="c")
    forge(lake, epoch, {"c": {"0": str(link)}})
    with pytest.raises(PathOutsideLakeError, match="resolves to"):
        recover(lake, g)
    assert row_counts(lake) == {"b": 0, "c": 0, "errors": 0}


def test_attempt_naming_its_own_staged_file_is_rolled_forward(tmp_path: Path) -> None:
    """The control: the same record with a file where staging puts it is delivered."""
    lake = Lake(root=str(tmp_path / "lake"))
    g, epoch = delivered_15(lake)
    snapshot = Snapshot("p", 1, {"a": Range("a", "0", 15, 15)})
    staged = stage(lake, snapshot, {"b": {"0": pa.table({"id": [1]}, schema=ROWS)},
                                    "c": {"0": pa.table({"id": [2]}, schema=ROWS)}})
    forge(lake, epoch, staged)
    result = recover(lake, g)
    assert result is not None and result.recovered and result.step == 1
    assert row_counts(lake) == {"b": 1, "c": 1, "errors": 0}


def test_a_snapshot_whose_processor_id_climbs_out_stages_nothing(tmp_path: Path) -> None:
    lake = Lake(root=str(tmp_path / "lake"))
    bad = Snapshot("../../../outside", 0, {"a": Range("a", "0", 0, 1)})
    with pytest.raises(PathOutsideLakeError, match="staging folder"):
        stage(lake, bad, {"c": {"0": pa.table({"id": [1]}, schema=ROWS)}})
    assert not (tmp_path / "outside").exists()


def test_the_refusal_is_a_platform_failure_never_a_user_error() -> None:
    err = PathOutsideLakeError("x", path="/tmp/evil.parquet")
    for phase in Phase:
        assert origin_of(err, phase=phase) is Origin.PLATFORM
    assert origin_of_exception_type(qualified_name(PathOutsideLakeError)) is Origin.PLATFORM


# -- the check itself ---------------------------------------------------------------------------
def test_confine_local_and_object_store_paths(tmp_path: Path) -> None:
    root = str(tmp_path / "lake")
    os.makedirs(root)
    inside = [f"{root}/queues/a/x.parquet", f"file://{root}/_cues/staging/p/f.parquet"]
    outside = [
        "/tmp/evil.parquet", f"{root}/../evil.parquet", f"{root}/queues/../../evil.parquet",
        f"{root}2/x.parquet", root, "relative/x.parquet", "", "s3://bucket/lake/x.parquet",
    ]
    for path in inside:
        assert confine(root=root, path=path) == path
    for path in outside:
        assert not is_inside(root=root, path=path), path
    staging = f"{root}/_cues/staging"
    assert not is_inside(root=root, path=f"{root}/queues/a/x.parquet", under=staging)
    s3 = "s3://bucket/lake"
    assert is_inside(root=s3, path="s3://bucket/lake/_cues/staging/p/f.parquet")
    for path in ["s3://other/lake/x.parquet", "s3://bucket/lake2/x.parquet", "gs://bucket/lake/x",
                 "s3://bucket/lake/../x.parquet", "s3://bucket/lake", "/tmp/lake/x.parquet"]:
        assert not is_inside(root=s3, path=path), path
    assert is_inside(root="s3://bucket", path="s3://bucket/any/key.parquet")
    with pytest.raises(PathOutsideLakeError) as info:
        confine(root=s3, path="s3://other/lake/x.parquet", named_by="a test", queue="q")
    assert info.value.queue == "q" and info.value.root == s3 and "named by a test" in str(info.value)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "..", ".", "lake", "lake-2", ""]), max_size=6))
def test_confine_accepts_exactly_the_paths_below_the_root(segments: list[str]) -> None:
    root = "/srv/lake"  # need not exist: realpath of a missing path is its normal form
    path = "/srv/lake/" + "/".join(segments)
    expected = ".." not in segments and "." not in segments and any(segments)
    assert is_inside(root=root, path=path) is expected
    remote = "s3://bucket/lake/" + "/".join(segments)
    assert is_inside(root="s3://bucket/lake", path=remote) is expected
