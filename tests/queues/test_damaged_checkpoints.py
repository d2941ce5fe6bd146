"""Damaged storage, named and survived: a torn or missing checkpoint falls back to the previous
checkpoint (or the commits) when every later commit entry is present, and otherwise fails in one
line naming the file; a system table's damage names the damaged file, never a healthy commit; a
newest commit cut down to its commitInfo line refuses appends."""

from __future__ import annotations

from pathlib import Path

import pytest

from cues_platform.queues import Lake, Producer
from cues_platform.queues.errors import LogIntegrityError
from cues_platform.queues.handle import verify_log
from cues_platform.queues.integrity import (
    DAMAGED_PREFIX,
    TableStorage,
    diagnose_unloadable,
    find_checkpoint_damage,
    open_delta_table,
)
from tests.support import PAYLOAD, rows

CHECKPOINT_EVERY = 5


def _log(uri: str) -> Path:
    return Path(uri.removeprefix("file://")) / "_delta_log"


def _checkpoints(uri: str) -> list[Path]:
    return sorted(_log(uri).glob("*.checkpoint.parquet"))


def _tear(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _queue_with_checkpoints(lake: Lake, appends: int = 12):
    q = lake.create_queue("orders", schema=PAYLOAD,
                          properties={"delta.checkpointInterval": str(CHECKPOINT_EVERY)})
    for i in range(appends):
        q.append(rows(i, 1), partition="0")
    assert [int(p.name[:20]) for p in _checkpoints(q.uri)] == [4, 9]
    return q


def _load_error(uri: str) -> Exception:
    from deltalake import DeltaTable

    with pytest.raises(Exception) as info:  # noqa: PT011 - delta-rs' own error, whatever its type
        DeltaTable(uri)
    return info.value


# -- a queue's torn or missing checkpoint -------------------------------------------------------------
@pytest.mark.parametrize("damage", ["torn", "missing"])
def test_a_damaged_newest_checkpoint_of_a_queue_falls_back_to_the_previous_one(lake, damage) -> None:
    q = _queue_with_checkpoints(lake)
    newest = _checkpoints(q.uri)[-1]
    if damage == "torn":
        _tear(newest)
    else:
        newest.unlink()
    storage = TableStorage(q.uri)
    found = find_checkpoint_damage(storage)
    assert found is not None and found.fallback == 4  # every commit after checkpoint 4 is there
    named = diagnose_unloadable(storage, what="queue 'orders'", error=_load_error(q.uri))
    assert isinstance(named, LogIntegrityError) and "\n" not in str(named)
    shown = newest.name if damage == "torn" else "_last_checkpoint"
    assert shown in str(named) and "open it again" in str(named)
    dt = open_delta_table(q.uri, None, what="queue 'orders'")
    assert dt.version() == 12 and dt.transaction_version("part:0") == 12
    if damage == "torn":  # kept for inspection, where no reader takes it for a checkpoint
        assert (_log(q.uri) / f"{DAMAGED_PREFIX}{newest.name}").exists() and not newest.exists()
    assert find_checkpoint_damage(storage) is None
    fresh = Lake(root=lake.root).queue("orders")
    fresh.append(rows(12, 1), partition="0")  # nothing lost, no offset reused
    assert fresh.read_arrow(partition="0")["_offset"].to_pylist() == list(range(13))
    assert verify_log(fresh) == []


@pytest.mark.parametrize("damage", ["torn", "missing"])
def test_a_queue_whose_newest_checkpoint_is_damaged_opens_through_the_lake_and_appends_go_on(
        lake, damage) -> None:
    """The review's case through the public API: ``Lake.queue`` (delta-rs alone: "Corrupt
    footer", naming no file) loads from the previous checkpoint plus every later commit, and the
    next appends take the next offsets, nothing lost, nothing reused."""
    q = _queue_with_checkpoints(lake)
    newest = _checkpoints(q.uri)[-1]
    if damage == "torn":
        _tear(newest)
    else:
        newest.unlink()
    _load_error(q.uri)  # delta-rs alone cannot load it
    fresh = Lake(root=lake.root).queue("orders")
    assert fresh.version() == 12 and fresh.next_offset("0") == 12
    for i in range(12, 15):
        assert fresh.append(rows(i, 1), partition="0").ranges == {"0": (i, i + 1)}
    got = fresh.read_arrow(partition="0")
    assert got["_offset"].to_pylist() == list(range(15)) and got["id"].to_pylist() == list(range(15))
    assert find_checkpoint_damage(TableStorage(q.uri)) is None and verify_log(fresh) == []
    again = Lake(root=lake.root).queue("orders")  # and it opens again, without falling back
    assert again.next_offset("0") == 15


def test_a_queue_whose_damaged_checkpoint_cannot_be_done_without_is_refused_by_the_lake(lake) -> None:
    q = _queue_with_checkpoints(lake)
    torn = _checkpoints(q.uri)[-1]
    _tear(torn)
    (_log(q.uri) / f"{7:020d}.json").unlink()
    with pytest.raises(LogIntegrityError) as info:
        Lake(root=lake.root).queue("orders")
    message = str(info.value)
    assert "\n" not in message and torn.name in message and f"{7:020d}.json" in message
    assert "from a backup" in message and info.value.path.endswith(torn.name)


def test_a_torn_checkpoint_with_a_missing_commit_after_the_previous_one_fails_naming_both(lake) -> None:
    q = _queue_with_checkpoints(lake)
    torn = _checkpoints(q.uri)[-1]
    _tear(torn)
    lost = _log(q.uri) / f"{7:020d}.json"
    lost.unlink()  # as a log trim would have, or a lost file: the older state cannot be rebuilt
    before = sorted(p.name for p in _log(q.uri).iterdir())
    with pytest.raises(LogIntegrityError) as info:
        open_delta_table(q.uri, None, what="queue 'orders'")
    message = str(info.value)
    assert "\n" not in message and torn.name in message and lost.name in message
    assert "Restore" in message and not info.value.retryable
    assert info.value.path.endswith(torn.name)
    assert sorted(p.name for p in _log(q.uri).iterdir()) == before  # nothing moved or deleted
    named = diagnose_unloadable(TableStorage(q.uri), what="queue 'orders'", error=_load_error(q.uri))
    assert torn.name in str(named) and "from a backup" in str(named)


def test_a_healthy_log_has_no_checkpoint_damage_and_opens_unchanged(lake) -> None:
    q = _queue_with_checkpoints(lake)
    before = sorted(p.name for p in _log(q.uri).iterdir())
    assert find_checkpoint_damage(TableStorage(q.uri)) is None
    assert open_delta_table(q.uri, None, what="queue 'orders'").version() == 12
    assert sorted(p.name for p in _log(q.uri).iterdir()) == before


# -- the tailer-positions table ---------------------------------------------------------------------
def _positions(lake: Lake, commits: int):
    q = lake.create_queue("orders", schema=PAYLOAD)
    q.append(rows(0, commits + 1), partition="0")
    tailer = q.tailer("billing", partition="0")
    for position in range(1, commits + 1):
        tailer.commit(position)
    return q, lake.system_uri("positions")


def test_a_torn_checkpoint_of_the_positions_table_falls_back_and_keeps_every_position(lake) -> None:
    _, uri = _positions(lake, 205)  # checkpoints at 99 and 199 (one commit per position)
    torn = _checkpoints(uri)[-1]
    assert torn.name.startswith(f"{199:020d}")
    _tear(torn)
    fresh = Lake(root=lake.root)
    assert fresh.queue("orders").tailer("billing", partition="0").position == 205
    assert (_log(uri) / f"{DAMAGED_PREFIX}{torn.name}").exists()


def test_a_truncated_newest_commit_of_the_positions_table_is_named_not_a_healthy_one(lake) -> None:
    _, uri = _positions(lake, 3)
    newest = sorted(_log(uri).glob("*.json"))[-1]
    text = newest.read_text()
    newest.write_text(text[: len(text) // 2])
    with pytest.raises(LogIntegrityError) as info:
        Lake(root=lake.root).queue("orders").tailer("billing", partition="0")
    message = str(info.value)
    assert "\n" not in message and newest.name in message and "truncated or not JSON" in message
    assert info.value.path.endswith(newest.name) and info.value.version == int(newest.name[:20])
    # the healthy commits before it are not blamed (they carry no cues.ranges: no queue rule)
    assert all(p.path.endswith(newest.name) for p in info.value.problems)


# -- a newest commit cut down to its commitInfo line ------------------------------------------------
def _cut_to_commit_info(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith('{"commitInfo"')
    path.write_text(first + "\n")


@pytest.mark.parametrize("writer", ["append", "producer"])
def test_a_newest_commit_cut_to_its_commit_info_refuses_appends_naming_it(lake, writer) -> None:
    q = lake.create_queue("orders", schema=PAYLOAD)
    producer = Producer(q, producer_id="p1")
    for i in range(3):
        if writer == "append":
            q.append(rows(i, 1), partition="0")
        else:
            producer.send(rows(i, 1), partition="0")
    newest = sorted(_log(q.uri).glob("*.json"))[-1]
    _cut_to_commit_info(newest)
    fresh = Lake(root=lake.root).queue("orders")  # delta-rs loads it: a commit of nothing
    assert fresh.next_offset("0") == 2  # what the damage does: offset 2 would be handed out again
    with pytest.raises(LogIntegrityError) as info:
        fresh.append(rows(9, 1), partition="0")
    message = str(info.value)
    assert newest.name in message and "holds only its commitInfo" in message
    assert info.value.path.endswith(newest.name) and info.value.version == int(newest.name[:20])
    assert sorted(_log(q.uri).glob("*.json"))[-1] == newest  # nothing appended on top
    problems = verify_log(fresh)  # what the auditor's full check reports
    assert problems and "holds only its commitInfo" in problems[0].detail


def test_a_commit_that_legitimately_holds_only_commit_info_is_not_damage(lake) -> None:
    """An empty write with no app transaction (a processor's at-least-once nil step) is a
    commitInfo line alone, declaring 0 rows: that is no damage."""
    from deltalake import write_deltalake

    q = lake.create_queue("orders", schema=PAYLOAD)
    q.append(rows(0, 1), partition="0")
    write_deltalake(q.refresh(), q.table_schema.empty_table(), mode="append")
    newest = sorted(_log(q.uri).glob("*.json"))[-1]
    assert len(newest.read_text().splitlines()) == 1
    q.append(rows(1, 1), partition="0")
    assert q.read_arrow(partition="0")["_offset"].to_pylist() == [0, 1]
    assert verify_log(q) == []
