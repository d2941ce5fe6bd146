"""A big append's files written on several threads (``queues/parallel_files.py``).

The rows, offsets and statistics equal what delta-rs' own writer commits; a SIGKILL between the
files and the commit leaves no row (orphan files that vacuum removes) and the next append takes
the same offsets; a processor step killed there, or right after its commit, is delivered
exactly once after a restart; an append whose offsets another writer took meanwhile is retried
with new files; threads appending big batches through one handle get dense, disjoint offsets.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cues_platform.audit import audit
from cues_platform.processing import GraphRunner, ReadAs
from cues_platform.processing.graph import Graph, In, Kind, Options, Out, Processor, QueueDef
from cues_platform.queues import Lake, OffsetLayout, parallel_files
from cues_platform.queues.maintenance import vacuum
from tests.support import PAYLOAD, ROOT, rows

MIN = parallel_files.PARALLEL_MIN_ROWS
BIG = MIN + 1_000
META = ["_offset", "_producer_id", "_producer_seq", "_delivery_hash", "_message_type", "_txn_id"]


def _root(q) -> Path:
    return Path(q.uri.removeprefix("file://"))


def _files(q) -> set[str]:
    return {str(p.relative_to(_root(q))) for p in _root(q).rglob("*.parquet")
            if "_delta_log" not in p.parts}


def _live(q) -> set[str]:
    return set(pa.table(q.refresh().get_add_actions(flatten=True))["path"].to_pylist())


@pytest.fixture(autouse=True)
def two_cores(monkeypatch) -> None:
    """The threads' path on any machine (with one core, ``pays`` leaves appends to delta-rs)."""
    monkeypatch.setattr(parallel_files, "cores", lambda: 2)


@pytest.mark.parametrize("layout", list(OffsetLayout))
def test_a_big_append_commits_the_rows_offsets_and_statistics_delta_rs_would(lake, layout, monkeypatch):
    fast = lake.create_queue("fast", schema=PAYLOAD, partitions=("0", "1"), offset_layout=layout)
    plain = lake.create_queue("plain", schema=PAYLOAD, partitions=("0", "1"), offset_layout=layout)
    fast.append(rows(0, 5), partition="0")
    plain.append(rows(0, 5), partition="0")
    big = {"0": rows(5, BIG), "1": rows(0, 10)}
    result = fast.append_many(big)
    monkeypatch.setattr(parallel_files, "PARALLEL_MIN_ROWS", 10**12)  # delta-rs' writer
    expected = plain.append_many(big)

    assert result.ranges == expected.ranges == {"0": (5, 5 + BIG), "1": (0, 10)}
    assert result.version == fast.refresh().version() == 2
    for p in ("0", "1"):
        got, want = fast.read_arrow(partition=p), plain.read_arrow(partition=p)
        assert got.select(PAYLOAD.names + META).equals(want.select(PAYLOAD.names + META))
    # one file per core (two) of the big partition, each at least half the threshold
    actions = pa.table(fast.refresh().get_add_actions(flatten=True)).to_pylist()
    new = [a for a in actions if a["path"].startswith("_partition=0/part-") and a["num_records"] > 5]
    assert len(new) == 2
    assert sum(a["num_records"] for a in new) == BIG
    # each file's statistics: its offsets, in order, tiling the appended range
    spans = sorted((a["min._offset"], a["max._offset"], a["num_records"]) for a in new)
    assert spans[0][0] == 5 and spans[-1][1] == 4 + BIG
    assert all(hi - lo + 1 == n for lo, hi, n in spans)
    assert all(a["null_count._offset"] == 0 and a["min._append_time"] is not None for a in new)
    # Parquet statistics of the STATS columns only, the ones the Delta statistics are of
    footer = pq.read_metadata(f"{fast.uri.removeprefix('file://')}/{new[0]['path']}")
    with_stats = {footer.schema.column(i).name for i in range(footer.num_columns)
                  if footer.row_group(0).column(i).statistics is not None}
    assert with_stats == set(parallel_files.STATS) & set(footer.schema.names)
    # dictionaries of the string columns only: none of a unique number such as _offset
    columns = [footer.schema.column(i) for i in range(footer.num_columns)]
    dictionary = {c.name for i, c in enumerate(columns)
                  if any("DICTIONARY" in e for e in footer.row_group(0).column(i).encodings)}
    assert dictionary == {c.name for c in columns if c.physical_type == "BYTE_ARRAY"}
    assert "_offset" not in dictionary and "_delivery_hash" in dictionary
    # the same partition values as delta-rs' files (a based queue: _base 0, absolute offsets)
    theirs = pa.table(plain.refresh().get_add_actions(flatten=True)).to_pylist()
    values = {k for a in theirs for k in a if k.startswith("partition.")}
    assert {(k, a[k]) for a in new for k in values} == {(k, a[k]) for a in theirs for k in values
                                                       if a["partition._partition"] == "0"}


def test_the_dictionary_columns_are_the_byte_array_leaves_nested_ones_included(tmp_path):
    schema = pa.schema([("n", pa.int64()), ("s", pa.string()), ("b", pa.binary()),
                        ("st", pa.struct([("x", pa.string()), ("y", pa.float64())])),
                        ("l", pa.list_(pa.large_string())), ("m", pa.map_(pa.string(), pa.int64())),
                        ("d", pa.decimal128(10, 2)), ("t", pa.timestamp("us", tz="UTC"))])
    names = parallel_files.dictionary_columns(schema)
    assert names == ("s", "b", "st.x", "l.list.element", "m.key_value.key")
    # pyarrow takes the paths as they are: the file dictionary-encodes those leaves and no other
    table = pa.table({"n": [1, 2], "s": ["a", "a"], "b": [b"x", b"x"], "st": [{"x": "p", "y": 1.0}] * 2,
                      "l": [["q"], ["q"]], "m": [[("k", 1)], [("k", 2)]], "d": [None, None],
                      "t": [None, None]}, schema=schema)
    pq.write_table(table, tmp_path / "f.parquet", use_dictionary=list(names))
    footer = pq.read_metadata(tmp_path / "f.parquet")
    encoded = {footer.schema.column(i).path for i in range(footer.num_columns)
               if any("DICTIONARY" in e for e in footer.row_group(0).column(i).encodings)}
    assert encoded == set(names)
    assert pq.read_table(tmp_path / "f.parquet").equals(table)


KILL_IN_COMMIT = textwrap.dedent("""
    import json, os, signal, sys
    sys.path.insert(0, {root!r})
    from deltalake import DeltaTable
    from tests.support import rows
    from cues_platform.queues import Lake, parallel_files

    parallel_files.cores = lambda: 2  # the threads' path on any machine (one core writes one file)

    def killed(self, actions, *args, **kwargs):
        big = {rows_min} <= sum(json_rows(a) for a in actions)
        if big and {before!r}:
            os.kill(os.getpid(), signal.SIGKILL)  # the files are written, the commit is not
        done = original(self, actions, *args, **kwargs)
        if big:
            os.kill(os.getpid(), signal.SIGKILL)  # committed, never acknowledged
        return done

    def json_rows(action):
        return json.loads(action.stats)["numRecords"]

    original = DeltaTable.create_write_transaction
    DeltaTable.create_write_transaction = killed
    {body}
""")


def _run_killed(root: str, body: str, *, before: bool = True) -> None:
    script = KILL_IN_COMMIT.format(root=str(ROOT), rows_min=MIN // 2, before=before,
                                   body=textwrap.indent(textwrap.dedent(body), "").strip())
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]


def test_a_sigkill_between_the_files_and_the_commit_leaves_no_row_and_orphans_vacuum_removes(lake):
    q = lake.create_queue("events", schema=PAYLOAD, partitions=("0",))
    q.append(rows(0, 3), partition="0")
    _run_killed(lake.root, f"""
        Lake(root={lake.root!r}).queue("events").append(rows(3, {BIG}), partition="0")
    """)
    q = Lake(root=lake.root).queue("events")
    orphans = _files(q) - _live(q)
    assert len(orphans) >= 1  # the killed append's files, in no snapshot
    assert q.next_offset("0") == 3 and q.read_arrow(partition="0")["id"].to_pylist() == [0, 1, 2]
    # the next append takes the same offsets
    assert q.append(rows(3, 4), partition="0").ranges == {"0": (3, 7)}
    # vacuum keeps the orphans within the retention and removes them once older than it
    assert vacuum(q, retention_hours=24).files_vacuumed == 0 and orphans <= _files(q)
    past = time.time() - 25 * 3600
    for name in orphans:
        os.utime(_root(q) / name, (past, past))
    assert vacuum(q, retention_hours=24).files_vacuumed == len(orphans)
    assert not orphans & _files(q)
    assert q.read_arrow(partition="0")["id"].to_pylist() == list(range(7))


def _graph() -> Graph:
    def double(ctx, src: pa.Table) -> pa.Table:  # noqa: ANN001
        return pa.table({"id": pa.compute.multiply(src["id"], 2), "note": src["note"]})

    return Graph.build(name="big", queues=[QueueDef("src", PAYLOAD), QueueDef("out", PAYLOAD)],
                       processors=[Processor("double", Kind.MAP, double, {"src": In("src")},
                                             {"out": Out("out")},
                                             options=Options(batch_size=BIG, max_batch_size=BIG,
                                                             read_as=ReadAs.ARROW))])


@pytest.mark.parametrize("before", [True, False], ids=["before-commit", "after-commit-before-ack"])
def test_a_step_killed_in_its_big_output_commit_is_delivered_once(lake, before):
    """SIGKILL with the step's output files written and not committed, or committed and never
    acknowledged: the next runner delivers each row once, in order, and the audit is clean."""
    graph = _graph()
    GraphRunner(graph=graph, lake=lake, spark=None)  # creates the queues
    lake.queue("src").append(rows(0, BIG), partition="0")
    _run_killed(lake.root, f"""
        from tests.queues.test_parallel_files import _graph
        from cues_platform.processing import GraphRunner
        GraphRunner(graph=_graph(), lake=Lake(root={lake.root!r}), spark=None).run_until_idle()
    """, before=before)
    lake = Lake(root=lake.root)
    # nothing delivered by a step killed before its commit; all of it by one killed after it
    assert lake.queue("out").next_offset("0") == (0 if before else BIG)
    runner = GraphRunner(graph=graph, lake=lake, spark=None)
    runner.recover()
    runner.run_until_idle()
    out = lake.queue("out").read_arrow(partition="0")
    assert out["id"].to_pylist() == list(range(0, 2 * BIG, 2))  # every row once, in order
    assert out["_offset"].to_pylist() == list(range(BIG))
    report = audit(lake, graph=graph)
    assert report.ok, report


def test_an_append_whose_offsets_another_writer_took_is_retried_with_new_files(lake):
    q = lake.create_queue("events", schema=PAYLOAD, partitions=("0",))
    other = Lake(root=lake.root).queue("events")
    calls = []

    def meanwhile(dt):  # noqa: ANN001, ANN202 - a guard: another writer appends on first sight
        calls.append(dt.version())
        if len(calls) == 1:
            other.append(rows(-2, 2), partition="0")
        return None

    result = q.append(rows(0, BIG), partition="0", guards=[meanwhile])
    assert result.attempts == 2 and result.ranges == {"0": (2, 2 + BIG)}
    ids = q.read_arrow(partition="0")["id"].to_pylist()
    assert ids == [-2, -1, *range(BIG)]
    assert len(_files(q) - _live(q)) >= 1  # the first attempt's files: orphans, in no snapshot


def test_threads_appending_big_batches_through_one_handle_get_dense_disjoint_offsets(lake):
    q = lake.create_queue("events", schema=PAYLOAD, partitions=("0",))
    results, errors = {}, []

    def send(k: int) -> None:
        try:
            results[k] = q.append(rows(k * 10**7, BIG), partition="0").ranges["0"]
        except Exception as exc:  # noqa: BLE001 - reported below, the test fails on it
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(results.values()) == [(i * BIG, (i + 1) * BIG) for i in range(3)]
    table = q.read_arrow(partition="0")
    assert table["_offset"].to_pylist() == list(range(3 * BIG))
    for k, (start, end) in results.items():
        assert table["id"].slice(start, end - start).to_pylist() == list(range(k * 10**7, k * 10**7 + BIG))
    records = pa.table(q.refresh().get_add_actions(flatten=True))["num_records"].to_pylist()
    assert sum(records) == 3 * BIG
