"""The property checkers themselves: each accepts what it should and rejects the rest."""

from __future__ import annotations

import pytest

from cues_platform.pipes import Property, check

SENT = [1, 2, 3, 4]

CASES = [
    # received,          at-least-once, strictly mono, monotonic, continuous, absolute
    ([1, 2, 3, 4], True, True, True, True, True),
    ([1, 1, 2, 3, 3, 4], True, False, True, True, False),
    ([1, 3, 4], False, True, True, False, False),
    ([1, 3, 2, 4], True, False, False, False, False),
    ([2, 3, 4], False, True, True, False, False),
    ([1, 2], False, True, True, True, False),
    ([1, 2, 1, 3, 4], True, False, False, False, False),
    ([1, 2, 5], False, False, False, False, False),
    ([], False, True, True, True, False),
]
ORDER = [
    Property.AT_LEAST_ONCE,
    Property.STRICTLY_MONOTONIC,
    Property.MONOTONIC,
    Property.CONTINUOUSLY_ORDERED,
    Property.ABSOLUTELY_ORDERED,
]


@pytest.mark.parametrize("case", CASES, ids=[str(c[0]) for c in CASES])
def test_checkers(case: tuple[object, ...]) -> None:
    received, *expected = case
    got = [check(p, SENT, received) is None for p in ORDER]  # type: ignore[arg-type]
    assert got == expected


def test_sent_payloads_must_be_distinct() -> None:
    assert check(Property.AT_LEAST_ONCE, [1, 1], [1]) == "sent payloads must be distinct"
