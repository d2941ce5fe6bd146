"""The README's Python examples, executed as printed (in a fresh namespace, in an empty temporary
working directory, on the session's Spark), and what they claim checked on the lake they wrote.

"Processors" continues "Usage" (it uses its ``lake`` and ``schema``), so it runs after it in the
same namespace, as a reader pasting both into one script would. The README's shell blocks are
run by tests/docs/test_docs_examples.py (see the registry in tests/docs/examples.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cues_platform.queues import Lake
from tests.docs.examples import python_block


def _payload(lake: Lake, queue: str, partition: str) -> list[tuple[str, float, int]]:
    t = lake.queue(queue).read_arrow(partition=partition)
    return sorted(zip(t["message_id"].to_pylist(), t["amount"].to_pylist(), t["_offset"].to_pylist(),
                      strict=True))


def test_usage_producers_transactions_tailers(spark: Any, chdir_tmp: Path,
                                              exec_block: Callable[..., dict]) -> None:
    ns = exec_block(python_block("README.md", "Usage"))
    lake = Lake(root=chdir_tmp / "lake")
    assert ns["lake"] == lake  # "lake" is relative to the working directory
    # the first send got offset 0 of bank-b; "a resend: returns the same offsets" -> nothing new
    result = ns["result"]
    assert result.ranges == {"bank-b": (0, 1)} and not result.duplicate
    assert _payload(lake, "postings", "bank-b") == [("m1", 10.0, 0)]
    again = ns["producer"].send({"message_id": ["m1"], "amount": [10.0]}, partition="bank-b", sequence=0)
    assert again.duplicate and again.ranges == result.ranges  # the printed resend's return value
    # the buffered producer's flush and the transaction both committed to bank-a
    assert _payload(lake, "postings", "bank-a") == [("m2", 1.0, 0), ("m3", 5.0, 1)]
    # the tailer read bank-b with Spark and its position is durable (a new handle sees it)
    assert [(r["message_id"], r["_offset"]) for r in ns["frame"].collect()] == [("m1", 0)]
    assert ns["postings"].tailer("settlement", partition="bank-b").committed_position() == 1
    # the small Arrow read
    assert ns["small"].select(["message_id", "amount"]).to_pylist() == [{"message_id": "m1", "amount": 10.0}]


def test_processor_example(spark: Any, chdir_tmp: Path, exec_block: Callable[..., dict]) -> None:
    """`convert` multiplies the amounts of every partition of postings by 1.1 into the same
    partition of `converted`, exactly once, one lane per partition.

    Fails on main: the input frame carries the queue's `_` metadata columns, so the returned frame
    is refused with ReservedColumnError and every batch lands in `errors` (issue 9, item 4).
    """
    ns = exec_block(python_block("README.md", "Usage"), python_block("README.md", "Processors (exactly-once by default)"))
    lake = Lake(root=chdir_tmp / "lake")
    errors = lake.queue("errors").read_arrow(partition="0")
    assert errors.num_rows == 0, (
        f"the README's processor sent {errors.num_rows} batch(es) to the error queue: "
        f"{errors.select(['exception_type', 'message']).to_pylist()}")
    converted = {p: [(m, a) for m, a, _ in _payload(lake, "converted", p)] for p in ("bank-a", "bank-b")}
    assert converted["bank-a"] == [("m2", pytest.approx(1.1)), ("m3", pytest.approx(5.5))]
    assert converted["bank-b"] == [("m1", pytest.approx(11.0))]  # sent twice, stored once
    assert sorted(ns["graph"].processors) == ["convert.bank-a", "convert.bank-b"]
    # "recovery, then steps until drained": running again delivers nothing twice
    ns["GraphRunner"](graph=ns["graph"], lake=ns["lake"]).run_until_idle()
    assert {p: [(m, a) for m, a, _ in _payload(lake, "converted", p)] for p in converted} == converted
