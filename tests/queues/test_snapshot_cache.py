"""The per-version cache of app transactions and add actions (queues/snapshot_cache.py) answers
exactly what delta-rs reads from the log, whoever committed, and never from another table."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cues_platform.queues import Lake
from tests.support import PAYLOAD, rows

APPS = ["proc:p", "epoch:p", "pos:p:in", "other"]
_dirs = itertools.count()

ops = st.lists(st.tuples(st.sampled_from(["ours", "other_handle", "raw", "read"]),
                         st.dictionaries(st.sampled_from(APPS), st.integers(0, 50), max_size=3)),
               min_size=1, max_size=8)


def truth(uri: str) -> dict[str, int | None]:
    dt = DeltaTable(uri)
    return {app: dt.transaction_version(app) for app in [*APPS, "part:0"]}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=ops)
def test_cached_versions_equal_the_log_whoever_commits(tmp_path: Path, sequence) -> None:
    lake = Lake(root=str(tmp_path / f"lake{next(_dirs)}"))
    q = lake.create_queue("q", schema=PAYLOAD)
    other = Lake(root=lake.root).queue("q")  # a second writer with its own handle and cache
    offset = 0
    for kind, txns in sequence:
        if kind == "ours" or kind == "other_handle":
            writer = q if kind == "ours" else other
            writer.append(rows(offset, 2), partition="0", app_transactions=sorted(txns.items()))
            offset += 2
        elif kind == "raw":  # a commit by plain delta-rs, outside any queue handle
            write_deltalake(q.uri, q.table_schema.empty_table(), mode="append",
                            commit_properties=CommitProperties(
                                app_transactions=[Transaction(a, v) for a, v in txns.items()]))
        for app in APPS:  # read everything, so stale entries would be there to be wrong
            q.txn_version(app)
        expected = truth(q.uri)
        assert {app: q.txn_version(app) for app in expected} == expected
        assert q.next_offset("0") == offset
        assert sum(f.rows for f in q.files(partition="0")) == offset


def test_a_table_created_again_at_the_same_path_is_never_answered_from_the_old_one(lake) -> None:
    q = lake.create_queue("q", schema=PAYLOAD)
    q.append(rows(0, 3), partition="0", app_transactions=[("proc:p", 7)])
    assert q.txn_version("proc:p") == 7 and q.next_offset("0") == 3
    old_version = q.version()
    shutil.rmtree(lake.local_path(q.uri))
    again = Lake(root=lake.root).create_queue("q", schema=PAYLOAD)
    again.append(rows(0, 3), partition="0", app_transactions=[("proc:p", 1)])
    assert again.version() == old_version  # same path, same version number, another table
    dt = DeltaTable(q.uri)
    # the first handle's cache holds (old table id, version): the new table's id misses it
    assert q.cache.transaction_version(dt, "proc:p") == 1
    assert q.cache.add_actions(dt).num_rows == 1
    assert q.next_offset("0", snapshot=dt) == 3


def test_no_seeding_when_the_table_expires_app_transactions(lake) -> None:
    q = lake.create_queue("q", schema=PAYLOAD)
    q.refresh().alter.set_table_properties({"delta.setTransactionRetentionDuration": "interval 1 days"})
    dt = q.refresh()
    q.txn_version("proc:p")
    before = q.cache.key(dt)
    q.append(rows(0, 1), partition="0", app_transactions=[("proc:p", 3)])
    # the new version's entries come from the log, not from the previous version plus ours
    assert q.cache.key(q.refresh()) == (before[0], before[1] + 1)
    assert q.cache._txns.get(q.cache.key(q.refresh()), {}) == {}
    assert q.txn_version("proc:p") == 3


def test_seeding_after_our_own_commit_reads_nothing_from_the_log(lake, monkeypatch) -> None:
    q = lake.create_queue("q", schema=PAYLOAD)
    q.append(rows(0, 1), partition="0", app_transactions=[("proc:p", 1)])
    assert q.txn_version("proc:p") == 1 and q.txn_version("other") is None
    q.append(rows(1, 1), partition="0", app_transactions=[("proc:p", 2)])
    calls: list[str] = []
    real = DeltaTable.transaction_version
    monkeypatch.setattr(DeltaTable, "transaction_version",
                        lambda self, app: calls.append(app) or real(self, app))
    assert (q.txn_version("proc:p"), q.txn_version("other"), q.next_offset("0")) == (2, None, 2)
    assert calls == []
    assert pa.table(DeltaTable(q.uri).get_add_actions(flatten=True)).num_rows == len(q.files())


def test_a_commit_rebased_over_another_writers_is_not_seeded(lake) -> None:
    q = lake.create_queue("q", schema=PAYLOAD)
    other = Lake(root=lake.root).queue("q")
    q.append(rows(0, 1), partition="0", app_transactions=[("proc:p", 1)])
    assert q.txn_version("foreign") is None

    def concurrent_writer(dt: DeltaTable) -> None:  # lands between our snapshot and our commit
        if other.txn_version("foreign") is None:
            write_deltalake(other.uri, other.table_schema.empty_table(), mode="append",
                            commit_properties=CommitProperties(app_transactions=[Transaction("foreign", 9)]))

    result = q.append(rows(1, 1), partition="0", app_transactions=[("proc:p", 2)], guards=[concurrent_writer])
    assert result.version == 3  # delta-rs rebased ours over the foreign commit (version 2)
    assert (q.txn_version("foreign"), q.txn_version("proc:p"), q.next_offset("0")) == (9, 2, 2)
