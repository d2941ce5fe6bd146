"""Issue 9, section 4 item 1: a batch given as a list of row dicts is checked row by row."""

from __future__ import annotations

import pytest

from cues_platform.queues import ReservedColumnError, SchemaError


@pytest.mark.parametrize(
    ("bad_row", "missing", "unexpected"),
    [
        ({"id": 2, "nte": "typo"}, ["note"], ["nte"]),  # a typo key
        ({"id": 2, "note": "x", "amount": 5}, [], ["amount"]),  # an extra key
        ({"id": 2}, ["note"], []),  # a missing key
    ],
)
def test_row_dicts_with_unknown_or_missing_keys_are_refused(
    make_queue, bad_row, missing, unexpected
) -> None:
    q = make_queue()
    batch = [{"id": 0, "note": "a"}, {"id": 1, "note": "b"}, bad_row]
    for send in (
        lambda: q.append(batch, partition="0"),
        lambda: q.producer(producer_id="p").send(batch, partition="0"),
    ):
        with pytest.raises(SchemaError) as info:
            send()
        err = info.value
        assert (err.row, err.missing, err.unexpected) == (2, missing, unexpected)
        assert "row 2" in str(err) and all(k in str(err) for k in missing + unexpected)
    assert q.count() == 0


def test_a_row_with_a_reserved_key_is_refused(make_queue) -> None:
    q = make_queue()
    with pytest.raises(ReservedColumnError) as info:
        q.append([{"id": 0, "note": "a"}, {"id": 1, "note": "b", "_offset": 9}], partition="0")
    assert info.value.row == 1 and info.value.column == "_offset"


def test_rows_with_the_same_keys_in_any_order_are_accepted(make_queue) -> None:
    q = make_queue()
    q.append([{"id": 0, "note": "a"}, {"note": None, "id": 1}], partition="0")
    assert q.read_arrow(partition="0").select(["id", "note"]).to_pylist() == [
        {"id": 0, "note": "a"},
        {"id": 1, "note": None},
    ]
