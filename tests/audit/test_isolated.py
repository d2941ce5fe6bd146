"""Step 7 of the audit (audit/isolated.py): every input row is delivered once or in the error
queue once, never both, never neither; a replayed error row is fed back once.

The lake (tests/audit/isolation_lakes.py) is built by real steps: isolated rows, whole-step rows,
replays that deliver and replays that fail again. Each rule is broken by committing what a buggy
platform would (backing records and error rows through delta-rs), and the audit names it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cues_platform.audit import audit
from cues_platform.audit.backing import Known
from cues_platform.audit.isolated import ErrorQueues, ErrorRow, error_row_checks, replay_checks
from cues_platform.audit.sequence import Steps
from cues_platform.processing import GraphRunner, Range, Record, RecordType
from cues_platform.processing.backing import ErrorRef, Snapshot
from cues_platform.processing.failures import CONTRACT_EXCEPTION_TYPE
from cues_platform.processing.replay import replay_errors
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from cues_platform.queues.retention import delete_below
from tests.audit.isolation_lakes import (
    build_isolated_lake,
    error_rows_of,
    forge_step,
    iso_graph,
    narrowed,
)
from tests.audit.lakes import only
from tests.support import rows

# The isolated lake's error queue, by offset: p's isolated rows (0: id 3, 1: id 4, 3: id 25, 5: id 35,
# 7: id 4 again, written by p's replay step 5) and q's whole-step rows (2, 4, 6, 8). Every row but
# 7 and 8 is replayed.
P_PENDING = 7
Q_PENDING = 8


@pytest.fixture(scope="session")
def isolated_lake(spark: object, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lake of isolation_lakes.py's docstring (built once per test session)."""
    base = tmp_path_factory.mktemp("audit_isolated")
    build_isolated_lake(spark, base / "lake")
    return base / "lake"


@pytest.fixture
def iso_copy(isolated_lake: Path, tmp_path: Path) -> Lake:
    """A private copy of the isolated lake, to tamper with."""
    shutil.copytree(isolated_lake, tmp_path / "lake")
    return Lake(root=str(tmp_path / "lake"))


def _more_input(lake: Lake) -> dict[str, Range]:
    """Ten more rows of ``a`` and the range a forged next step of ``p`` reads (continuing its
    positions, so that only the rule under test breaks)."""
    lake.queue("a").append(rows(40, 10), partition="0")
    return {"src": Range("a", "0", 40, 50)}


def test_a_clean_lake_with_isolated_rows_and_replays_passes(isolated_lake: Path) -> None:
    lake = Lake(root=str(isolated_lake))
    errors = error_rows_of(lake)
    inputs = [json.loads(e["inputs"])["src"] for e in errors]
    # what the lake holds: isolated rows (one offset), whole-step rows, a replay failing again
    assert [(e["processor"], e["step"]) for e in errors] == [
        ("p", 0), ("p", 0), ("q", 0), ("p", 2), ("q", 2), ("p", 3), ("q", 3), ("p", 5), ("q", 4)]
    assert [i[2:] for i in inputs] == [[3, 4], [4, 5], [0, 10], [25, 26], [20, 30], [35, 36],
                                       [30, 40], [4, 5], [0, 10]]
    report = audit(lake)
    assert report.ok, report.to_text()
    p, q = report.processors["p"], report.processors["q"]
    assert (p.error_rows, p.error_rows_replayed, p.error_rows_pending) == (5, 4, 1)
    assert (q.error_rows, q.error_rows_replayed, q.error_rows_pending) == (4, 3, 1)
    assert "error rows: 5 (4 replayed, 1 pending)" in report.to_text()
    assert report.to_dict()["processors"]["q"]["error_rows_pending"] == 1
    # every input offset: delivered once or in exactly one pending error row
    delivered = sorted(lake.queue("b").read_arrow(partition="0")["id"].to_pylist())
    pending = [json.loads(errors[P_PENDING]["inputs"])["src"][2]]
    assert sorted(delivered + pending) == list(range(40))
    delivered = sorted(lake.queue("c").read_arrow(partition="0")["id"].to_pylist())
    start, end = json.loads(errors[Q_PENDING]["inputs"])["src"][2:]
    assert sorted(delivered + list(range(start, end))) == list(range(40))


class Crash(BaseException):
    """A crash at a step protocol point (not an Exception: nothing handles it)."""


def _crash_at(point: str, nth: int) -> Callable[[str], None]:
    seen = {"n": 0}

    def hook(at: str) -> None:
        if at == point:
            seen["n"] += 1
            if seen["n"] == nth:
                raise Crash(at)

    return hook


def test_crashes_during_isolation_and_during_a_replay_leave_an_auditable_lake(spark, tmp_path) -> None:
    lake = Lake(root=str(tmp_path / "lake"))
    poison = {3, 4, 25}
    graph = iso_graph(poison)
    create_queues(graph, lake)
    lake.queue("a").append(rows(0, 40), partition="0")
    with pytest.raises(Crash):  # in the middle of isolating step 0's rows
        GraphRunner(graph=graph, lake=lake, spark=spark,
                    hook=_crash_at("after_isolation_call", 3)).run_until_idle()
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()  # recovers, isolates again
    assert audit(lake).ok
    poison.discard(3)
    poison.discard(25)
    with pytest.raises(Crash):  # the replay of errors/0@1 (id 4) logged, not committed
        replay_errors(graph=graph, processor="p", lake=lake, spark=spark,
                      hook=_crash_at("after_attempt", 2))
    report = audit(lake)
    assert report.ok, report.to_text()  # a logged replay step not committed yet is pending
    replay_errors(graph=graph, processor="p", lake=lake, spark=spark)  # rolls it forward
    report = audit(lake)
    assert report.ok, report.to_text()
    p = report.processors["p"]
    assert (p.error_rows, p.error_rows_replayed, p.error_rows_pending) == (4, 3, 1)
    pending = [json.loads(e["inputs"])["src"][2] for e in error_rows_of(lake)
               if e["processor"] == "p" and e["step"] >= 4]
    delivered = lake.queue("b").read_arrow(partition="0")["id"].to_pylist()
    assert sorted(delivered + pending) == list(range(40)) and pending == [4]


def test_only_a_replay_step_may_read_old_ranges_again(iso_copy: Lake) -> None:
    # the same re-read without `replay` is a step reading offsets twice: positions still say so
    forge_step(iso_copy, "p", {"src": Range("a", "0", 3, 4)})
    (v,) = only(audit(iso_copy), "overlap")
    assert (v.processor, v.offsets) == ("p", (3, 4))


def test_an_isolated_row_outside_its_step_is_a_violation(iso_copy: Lake) -> None:
    snap = forge_step(iso_copy, "p", _more_input(iso_copy),
                      errors=[{"inputs": narrowed("src", "a", 55)}])
    (v,) = only(audit(iso_copy), "error_row_inputs")
    end = len(error_rows_of(iso_copy))
    assert (v.processor, v.step, v.hash, v.queue, v.offsets) == ("p", snap.step, snap.delivery_hash,
                                                                 "errors", (end - 1, end))
    assert "a/0 [55, 56), not one offset inside the step's a/0 [40, 50)" in v.message


@pytest.mark.parametrize("inputs, words", [
    ("not json", "not JSON"),
    ('{"src": ["a", "0", 42]}', "not [queue, partition, start, end]"),
    ('{"src": ["a", "0", 42, 41]}', "not [queue, partition, start, end]"),
    ("[]", "not a JSON object"),
    ('{"other": ["a", "0", 42, 43]}', "its bindings are not the step's"),
    ('{"src": ["z", "0", 42, 43]}', "not one offset inside"),
    ('{"src": ["a", "0", 42, 44]}', "not one offset inside"),
])
def test_unreadable_or_malformed_inputs_fail_the_audit(iso_copy: Lake, inputs: str, words: str) -> None:
    forge_step(iso_copy, "p", _more_input(iso_copy), errors=[{"inputs": inputs}])
    (v,) = only(audit(iso_copy), "error_row_inputs")
    assert words in v.message and v.step == 8


def test_a_contract_break_narrowed_to_one_offset_is_a_violation(iso_copy: Lake) -> None:
    forge_step(iso_copy, "p", _more_input(iso_copy), errors=[
        {"inputs": narrowed("src", "a", 42), "exception_type": CONTRACT_EXCEPTION_TYPE, "queue": "b"}])
    (v,) = only(audit(iso_copy), "error_row_inputs")
    assert "a contract break holds the step's whole ranges" in v.message


def test_the_same_input_row_in_two_error_rows_of_a_step_is_a_violation(iso_copy: Lake) -> None:
    forge_step(iso_copy, "p", _more_input(iso_copy),
               errors=[{"inputs": narrowed("src", "a", 42)}, {"inputs": narrowed("src", "a", 43)},
                       {"inputs": narrowed("src", "a", 42)}])
    (v,) = only(audit(iso_copy), "error_row_twice")
    end = len(error_rows_of(iso_copy))
    assert v.offsets == (end - 1, end) and f"the error row at offset {end - 3}" in v.message
    assert "a/0 offset 42" in v.message


def test_an_isolated_row_beside_the_whole_step_row_is_a_violation(iso_copy: Lake) -> None:
    whole = json.dumps({"src": ["a", "0", 40, 50]})
    forge_step(iso_copy, "p", _more_input(iso_copy),
               errors=[{"inputs": whole}, {"inputs": narrowed("src", "a", 47)}, {"inputs": whole}])
    bad = only(audit(iso_copy), "error_row_twice")
    assert len(bad) == 2  # the second whole row, and the isolated row inside the first
    assert any("second whole-step error row" in v.message for v in bad)
    assert any("offset 47" in v.message and "the whole-step error row" in v.message for v in bad)


def test_contract_breaks_may_share_the_step_ranges_with_its_whole_row(iso_copy: Lake) -> None:
    whole = json.dumps({"src": ["a", "0", 40, 50]})
    contract = {"inputs": whole, "exception_type": CONTRACT_EXCEPTION_TYPE, "queue": "b"}
    forge_step(iso_copy, "p", _more_input(iso_copy),
               errors=[contract, contract, {"inputs": narrowed("src", "a", 41)}])
    report = audit(iso_copy)
    assert report.ok, report.to_text()
    assert report.processors["p"].error_rows == 8


def test_an_error_row_naming_another_step_is_a_violation(iso_copy: Lake) -> None:
    snap = forge_step(iso_copy, "p", _more_input(iso_copy),
                      errors=[{"inputs": narrowed("src", "a", 42), "processor": "q"}])
    (v,) = only(audit(iso_copy), "error_row_step")
    assert v.hash == snap.delivery_hash and "names processor 'q' step 8" in v.message


def test_a_replay_of_a_row_that_is_not_there_is_a_violation(iso_copy: Lake) -> None:
    snap = forge_step(iso_copy, "p", {"src": Range("a", "0", 3, 4)}, replay=ErrorRef("errors", "0", 99))
    (v,) = only(audit(iso_copy), "replay_missing")
    assert (v.step, v.hash, v.queue, v.offsets) == (snap.step, snap.delivery_hash, "errors", (99, 100))
    assert "does not hold that offset" in v.message


def test_a_replay_naming_a_queue_that_is_not_an_error_queue_is_a_violation(iso_copy: Lake) -> None:
    forge_step(iso_copy, "p", {"src": Range("a", "0", 3, 4)}, replay=ErrorRef("b", "0", 0))
    (v,) = only(audit(iso_copy), "replay_mismatch")
    assert "'b' is not an error queue" in v.message


def test_the_same_error_row_replayed_twice_is_a_violation(iso_copy: Lake) -> None:
    # errors/0@0 (p step 0, id 3) was replayed by p's step 4; a second replay step of it
    snap = forge_step(iso_copy, "p", {"src": Range("a", "0", 3, 4)}, replay=ErrorRef("errors", "0", 0))
    (v,) = only(audit(iso_copy), "replayed_twice")
    assert (v.step, v.hash, v.offsets) == (snap.step, snap.delivery_hash, (0, 1))
    assert "already by step 4 of 'p'" in v.message


@pytest.mark.parametrize("ref, inputs, words", [
    (Q_PENDING, ("a", "0", 0, 10), "processor 'q''s, not this lane's"),
    (P_PENDING, ("a", "0", 5, 6), "the row names inputs src=a/0 [4, 5), the replay step read src=a/0 [5, 6)"),
])
def test_a_replay_of_another_lanes_row_or_other_inputs_is_a_violation(
        iso_copy: Lake, ref: int, inputs: tuple, words: str) -> None:
    forge_step(iso_copy, "p", {"src": Range(*inputs)}, replay=ErrorRef("errors", "0", ref))
    (v,) = only(audit(iso_copy), "replay_mismatch")
    assert words in v.message


def test_a_replay_of_a_contract_break_is_a_violation(iso_copy: Lake) -> None:
    whole = {"src": Range("a", "0", 40, 50)}
    iso_copy.queue("a").append(rows(40, 10), partition="0")
    forge_step(iso_copy, "p", whole, errors=[{"inputs": json.dumps({"src": ["a", "0", 40, 50]}),
                                              "exception_type": CONTRACT_EXCEPTION_TYPE, "queue": "b"}])
    assert audit(iso_copy).ok
    contract_row = len(error_rows_of(iso_copy)) - 1
    forge_step(iso_copy, "p", whole, replay=ErrorRef("errors", "0", contract_row))
    (v,) = only(audit(iso_copy), "replay_mismatch")
    assert "contract break" in v.message


def test_replays_of_rows_retention_removed_are_counted_not_failed(iso_copy: Lake) -> None:
    delete_below(iso_copy.queue("errors"), {"0": P_PENDING})  # every replayed row is gone
    report = audit(iso_copy)
    assert report.ok, report.to_text()
    assert report.retained_steps["replays_of_retained_rows"] == 7
    assert "7 replay step(s) of error rows retained away" in report.to_text()
    assert (report.processors["p"].error_rows, report.processors["p"].error_rows_pending) == (1, 1)
    # a replay of a row that retention did NOT remove (above the start, never written) still fails
    forge_step(iso_copy, "p", {"src": Range("a", "0", 3, 4)}, replay=ErrorRef("errors", "0", 99))
    assert {v.kind for v in audit(iso_copy).violations} == {"replay_missing"}


def test_a_replay_that_cannot_be_read_is_unverifiable(iso_copy: Lake) -> None:
    for data in (Path(iso_copy.root) / "queues" / "errors").rglob("*.parquet"):
        data.unlink()
    report = audit(iso_copy)
    assert {"unreadable", "replay_unverifiable"} <= {v.kind for v in report.violations}
    assert len(report.by_kind("replay_unverifiable")) == 7
    assert all("cannot be read" in v.message for v in report.by_kind("replay_unverifiable"))


# Without a lake: the rules of one step's error rows, over hand-built snapshots.

def _known(start: int, end: int, side: tuple[int, int] = (0, 5)) -> Known:
    snap = Snapshot("j", 4, {"stream": Range("s", "0", start, end), "table": Range("t", "0", *side)})
    return Known("j", Record(RecordType.ATTEMPT_OUTPUT, snap, 1, {"rows": {"errors": {"0": 1}}}))


def _rows(k: Known, inputs: list[dict]) -> ErrorQueues:
    out = ErrorQueues(error_queues={"errors"})
    for i, body in enumerate(inputs):
        row = ErrorRow("errors", "0", i, k.record.hash, "j", 4, json.dumps(body), "builtins.ValueError")
        out.rows[row.ref] = row
        out.by_hash.setdefault(row.hash, []).append(row)
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 1_000), st.integers(1, 200), st.data())
def test_distinct_offsets_inside_the_step_pass_and_any_repeat_or_stray_is_named(
        start: int, size: int, data: st.DataObject) -> None:
    k = _known(start, start + size)
    offsets = data.draw(st.lists(st.integers(start, start + size - 1), unique=True, min_size=1,
                                 max_size=min(size, 30)))
    rows_ = [{"stream": ["s", "0", o, o + 1], "table": ["t", "0", 0, 5]} for o in offsets]
    assert error_row_checks({k.record.hash: k}, _rows(k, rows_)) == []
    assert len(rows_) <= size
    again = data.draw(st.sampled_from(rows_))
    bad = error_row_checks({k.record.hash: k}, _rows(k, [*rows_, again]))
    assert [v.kind for v in bad] == ["error_row_twice"] and bad[0].offsets == (len(rows_), len(rows_) + 1)
    stray = data.draw(st.one_of(st.integers(0, start - 1) if start else st.nothing(),
                                st.integers(start + size, start + size + 50)))
    bad = error_row_checks({k.record.hash: k}, _rows(k, [{"stream": ["s", "0", stray, stray + 1],
                                                          "table": ["t", "0", 0, 5]}]))
    assert [v.kind for v in bad] == ["error_row_inputs"]


def test_rows_narrowing_two_bindings_of_one_step_are_a_violation() -> None:
    k = _known(10, 20)
    bad = error_row_checks({k.record.hash: k}, _rows(k, [
        {"stream": ["s", "0", 12, 13], "table": ["t", "0", 0, 5]},
        {"stream": ["s", "0", 10, 20], "table": ["t", "0", 3, 4]}]))
    (v,) = bad
    assert v.kind == "error_row_inputs" and "narrow bindings stream, table" in v.message


def test_a_replay_matches_by_queue_and_partition_not_binding_name() -> None:
    # a redeploy renamed the binding: the replay step's ranges are the row's under the new name
    k = _known(10, 20)
    errors = _rows(k, [{"stream": ["s", "0", 12, 13], "table": ["t", "0", 0, 5]}])
    replay = Snapshot("j", 9, {"events": Range("s", "0", 12, 13), "dim": Range("t", "0", 0, 5)},
                      replay=ErrorRef("errors", "0", 0))
    steps = {"j": Steps({9: Record(RecordType.ATTEMPT_NIL, replay, 1)}, None, [])}
    assert replay_checks(steps, errors).violations == []
    moved = Snapshot("j", 9, {"events": Range("s", "0", 13, 14), "dim": Range("t", "0", 0, 5)},
                     replay=ErrorRef("errors", "0", 0))
    steps = {"j": Steps({9: Record(RecordType.ATTEMPT_NIL, moved, 1)}, None, [])}
    (v,) = replay_checks(steps, errors).violations
    assert v.kind == "replay_mismatch"
