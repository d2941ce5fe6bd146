"""Storage faults never invent or delete data: a lost log is never recreated empty, and a damaged
log (an emptied or truncated commit, a lost data file) refuses appends and is reported."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from cues_platform.queues import Lake, QueueError
from cues_platform.queues.errors import LogIntegrityError, MissingLogError, QueueExistsError
from cues_platform.queues.handle import verify_log
from cues_platform.queues.integrity import find_inconsistencies
from tests.support import PAYLOAD, rows


def _parquet(q) -> set[Path]:
    return set(Path(q.uri).rglob("*.parquet"))


def _log(q) -> Path:
    return Path(q.uri) / "_delta_log"


def _newest_commit(q) -> Path:
    return sorted(_log(q).glob("*.json"))[-1]


# -- a lost _delta_log -----------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["folder deleted", "folder emptied"])
def test_a_queue_whose_log_vanished_is_never_recreated_empty(lake, how) -> None:
    q = lake.create_queue("orders", schema=PAYLOAD)
    q.append(rows(0, 5), partition="0")
    data = _parquet(q)
    shutil.rmtree(_log(q))
    if how == "folder emptied":
        _log(q).mkdir()
    for call in (
        lambda: lake.create_queue("orders", schema=PAYLOAD, exist_ok=True),
        lambda: lake.create_queue("orders", schema=PAYLOAD),
        lambda: lake.queue("orders"),
    ):
        with pytest.raises(MissingLogError) as info:
            call()
        assert info.value.path == q.uri and "Restore the _delta_log folder" in str(info.value)
        assert q.uri in str(info.value) and not info.value.retryable
    assert _parquet(q) == data  # nothing deleted
    assert not any(_log(q).glob("*.json"))  # and no new, empty table


def test_graph_runner_start_refuses_an_input_queue_whose_log_vanished(lake) -> None:
    from cues_platform.processing.runner import GraphRunner, create_queues
    from tests.processing.graphs import build_graph, load_inputs

    graph = build_graph("map")
    create_queues(graph, lake)
    load_inputs(lake, "map")
    a = lake.queue("a")
    data = _parquet(a)
    shutil.rmtree(_log(a))
    with pytest.raises(MissingLogError) as info:
        GraphRunner(graph=graph, lake=lake, spark=None)  # creates its queues first (exist_ok)
    assert a.uri in str(info.value)
    assert _parquet(a) == data and not _log(a).exists()


def test_the_positions_table_whose_log_vanished_is_never_recreated_empty(make_queue, lake) -> None:
    q = make_queue()
    q.append(rows(0, 10), partition="0")
    q.tailer("billing", partition="0").commit(7)
    positions = Path(lake.system_uri("positions"))
    shutil.rmtree(positions / "_delta_log")
    with pytest.raises(MissingLogError) as info:
        q.tailer("billing", partition="0")  # would restart at 0 and re-read everything
    assert str(positions) in str(info.value) and "system table 'positions'" in str(info.value)


def test_the_coordinator_table_whose_log_vanished_is_never_recreated_empty(make_queue, lake) -> None:
    from cues_platform.queues import TransactionalProducer

    q = make_queue()
    producer = TransactionalProducer(lake, transactional_id="tx")
    producer.init_transactions()
    producer.begin()
    producer.send(q, rows(0, 2), partition="0")
    producer.commit()
    coordinator = Path(lake.system_uri("transactions"))
    shutil.rmtree(coordinator / "_delta_log")
    with pytest.raises(MissingLogError) as info:  # every decision (and epoch) would be forgotten
        TransactionalProducer(lake, transactional_id="tx").init_transactions()
    assert str(coordinator) in str(info.value)


def test_concurrent_creators_of_one_queue_all_get_it(lake) -> None:
    """A commit being written by another creator is not 'content without a log', and a creator
    that loses the race for version 0 (delta-rs: "protocol changed") reuses the winner's queue."""
    errors: list[BaseException] = []

    def create(name: str) -> None:
        try:
            Lake(root=lake.root).create_queue(name, schema=PAYLOAD, exist_ok=True)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    names = [f"shared{i}" for i in range(6)]
    for name in names:  # several rounds: one round alone rarely loses the race
        threads = [threading.Thread(target=create, args=(name,)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert lake.list_queues() == names


def test_a_creator_losing_the_race_without_exist_ok_is_told_the_queue_exists(lake) -> None:
    """Without ``exist_ok`` every creator but one gets QueueExistsError, never a raw Delta error."""
    errors: list[BaseException] = []

    def create() -> None:
        try:
            Lake(root=lake.root).create_queue("contested", schema=PAYLOAD)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 7
    assert all(isinstance(e, QueueExistsError) for e in errors), errors
    assert lake.list_queues() == ["contested"]


def test_racing_creators_with_different_definitions_leave_one_definition(lake) -> None:
    """delta-rs may rebase a losing CREATE TABLE to version 1, replacing the winner's metadata;
    ours never does: the log holds one commit, and its partitions are one creator's, whole."""
    for round_ in range(4):
        name = f"contested{round_}"
        outcomes: list[object] = []

        def create(
            parts: tuple[str, ...], name: str = name, outcomes: list[object] = outcomes
        ) -> None:
            try:
                outcomes.append(Lake(root=lake.root).create_queue(
                    name, schema=PAYLOAD, partitions=parts))
            except QueueExistsError as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=create, args=((f"p{i}",),)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        log = sorted(p.name for p in (Path(lake.root) / "queues" / name / "_delta_log").iterdir())
        assert log == ["00000000000000000000.json"]
        winners = [o for o in outcomes if not isinstance(o, QueueExistsError)]
        assert len(winners) == 1 and len(outcomes) == 6
        assert lake.queue(name).partitions == winners[0].partitions
        assert len(winners[0].partitions) == 1
    assert [p.name for p in (Path(lake.root) / "queues").iterdir() if p.name.startswith(".")] == []
    assert list((Path(lake.root) / "_cues" / "creating").iterdir()) == []  # no staging left


def test_a_create_killed_before_its_link_leaves_no_queue_and_can_be_run_again(lake) -> None:
    """The state a crash between steps 1 and 3 leaves: a complete staged table beside the queue."""
    from deltalake import DeltaTable

    from cues_platform.queues.schema import full_schema

    staged = Path(lake.root) / "_cues" / "creating" / ".orders.creating-0123"
    DeltaTable.create(str(staged), full_schema(PAYLOAD), partition_by=["_partition"])
    shutil.rmtree(staged / "_delta_log")  # killed halfway through removing it, too
    (staged / "_delta_log").mkdir()
    assert lake.list_queues() == []
    assert not lake.has_queue("orders")
    q = lake.create_queue("orders", schema=PAYLOAD)
    q.append(rows(0, 2), partition="0")
    assert lake.list_queues() == ["orders"]
    assert q.count() == 2
    from cues_platform.audit import audit

    assert audit(lake).ok  # the leftover is not taken for a queue whose log was lost


def test_a_created_queue_records_its_own_location(lake) -> None:
    """The first commit is written in a staging folder; its history names the queue's folder."""
    q = lake.create_queue("placed", schema=PAYLOAD)
    from deltalake import DeltaTable

    (first,) = DeltaTable(q.uri).history(1)
    assert first["operationParameters"]["location"].rstrip("/").endswith("/queues/placed")


def test_concurrent_openers_of_a_system_table_share_one_table(lake) -> None:
    """Consumer groups' positions table is created once however many consumers open it."""
    from cues_platform.queues.positions import SCHEMA, open_system_table

    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            open_system_table(Lake(root=lake.root), "positions", SCHEMA)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    log = Path(lake.system_uri("positions").removeprefix("file://")) / "_delta_log"
    assert sorted(p.name for p in log.iterdir()) == ["00000000000000000000.json"]


# -- a damaged newest commit -----------------------------------------------------------------------
def _filled(lake):
    q = lake.create_queue("orders", schema=PAYLOAD, partitions=("a", "b"))
    q.append(rows(0, 3), partition="a")
    q.append_many({"a": rows(3, 2), "b": rows(0, 4)})
    return q


def _assert_refused(q, path_part: str) -> None:
    """The append raises the typed error naming the file, and writes nothing."""
    log_before = sorted(p.name for p in _log(q).iterdir())
    data_before = _parquet(q)
    with pytest.raises(LogIntegrityError) as info:
        q.append(rows(100, 1), partition="a")
    assert path_part in str(info.value) and path_part in info.value.path
    assert "restore it from a backup" in str(info.value) and not info.value.retryable
    assert isinstance(info.value, QueueError)
    assert sorted(p.name for p in _log(q).iterdir()) == log_before
    assert _parquet(q) == data_before


def test_an_emptied_newest_commit_refuses_appends_and_is_reported(lake) -> None:
    q = _filled(lake)
    newest = _newest_commit(q)
    newest.write_text("")
    # the handle that wrote it and a fresh one: the next append would reuse offsets 3..4 of 'a'
    for handle in (q, Lake(root=lake.root).queue("orders")):
        _assert_refused(handle, newest.name)
    fresh = Lake(root=lake.root).queue("orders")
    problems = verify_log(fresh)
    assert [(p.kind, p.version) for p in problems] == [("commit", 2)]
    assert "is empty" in problems[0].detail and problems[0].path.endswith(newest.name)


def test_a_newest_commit_truncated_mid_json_refuses_appends_and_opening_names_it(lake) -> None:
    q = _filled(lake)
    newest = _newest_commit(q)
    text = newest.read_text()
    newest.write_text(text[: len(text) // 2])
    _assert_refused(q, newest.name)
    with pytest.raises(LogIntegrityError) as info:
        Lake(root=lake.root).queue("orders")  # delta-rs cannot load it: the error says which file
    message = str(info.value)
    assert "\n" not in message and newest.name in message and "truncated or not JSON" in message
    assert "restore that file from a backup before using the table again" in message  # what to do
    assert info.value.version == 2 and info.value.path.endswith(newest.name)


def test_a_commit_that_lost_its_last_lines_is_detected_by_its_declared_ranges(lake) -> None:
    q = _filled(lake)
    newest = _newest_commit(q)
    lines = newest.read_text().splitlines(keepends=True)
    # drop the add of partition 'b' (its part:b transaction survives)
    newest.write_text("".join(ln for ln in lines if '"_partition":"b"' not in ln or '"add"' not in ln))
    fresh = Lake(root=lake.root).queue("orders")
    _assert_refused(fresh, newest.name)
    problems = verify_log(fresh)
    kinds = {(p.kind, p.partition) for p in problems}
    assert ("commit", "b") in kinds  # declared rows 4 vs 0 in the files
    assert any("declares 6 added row(s) (operationMetrics)" in p.detail for p in problems)
    assert ("rows", "b") in kinds  # and the statistics check: part:b = 4, files hold 0


def test_a_lost_data_file_refuses_appends_and_is_reported(lake) -> None:
    q = _filled(lake)
    q.append(rows(5, 2), partition="a")
    newest_file = max(_parquet(q), key=lambda p: p.stat().st_mtime_ns)
    newest_file.unlink()
    _assert_refused(q, newest_file.name)
    fresh = Lake(root=lake.root).queue("orders")
    _assert_refused(fresh, newest_file.name)
    missing = [p for p in find_inconsistencies(fresh.name, fresh.refresh(), fresh.partitions)
               if p.kind == "missing-file"]
    assert [Path(p.path).name for p in missing] == [newest_file.name]


def test_the_full_check_finds_an_older_lost_file_and_a_healthy_queue_is_clean(lake) -> None:
    q = _filled(lake)
    for i in range(3):
        q.append(rows(10 + i, 1), partition="b")
    assert verify_log(q) == []
    oldest = min(_parquet(q), key=lambda p: p.stat().st_mtime_ns)
    oldest.unlink()
    problems = verify_log(Lake(root=lake.root).queue("orders"))
    assert {p.kind for p in problems} >= {"missing-file"}
    assert any(oldest.name in str(p) for p in problems)


def test_appends_check_each_new_commit_once_and_stay_correct(lake) -> None:
    """The per-append check reads only commits the handle has not seen (not the whole log)."""
    q = lake.create_queue("orders", schema=PAYLOAD)
    other = Lake(root=lake.root).queue("orders")
    for i in range(5):
        q.append(rows(i, 1), partition="0")
    other.append(rows(5, 1), partition="0")
    assert other._verified == other.version() - 1  # checked up to what it saw before its commit
    other.append(rows(6, 1), partition="0")
    assert other._verified == other.version() - 1
    assert q.read_arrow(partition="0")["id"].to_pylist() == list(range(7))
    assert verify_log(q) == []


def test_files_compacted_and_vacuumed_by_another_handle_are_not_damage(lake) -> None:
    from cues_platform.queues.maintenance import maintain

    a = lake.create_queue("orders", schema=PAYLOAD)
    a.append(rows(0, 1), partition="0")  # a has checked everything up to here
    b = Lake(root=lake.root).queue("orders")
    for i in range(1, 4):
        b.append(rows(i, 1), partition="0")
    maintain(b, retention_hours=0, unsafe_allow_short_retention=True)  # their files are gone
    a.append(rows(4, 1), partition="0")  # a now checks b's commits: their files were compacted
    assert a.read_arrow(partition="0")["id"].to_pylist() == list(range(5))
    assert verify_log(a) == []
