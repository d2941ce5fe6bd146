"""Data contracts: rows that break an output queue's pandera contract go to the error queue,
inside the same step and exactly once, with the failed checks named."""

from __future__ import annotations

import json

import pandera.pandas as pda
import pyarrow as pa
import pytest

from cues_platform.audit import audit
from cues_platform.processing import (
    ERROR_SCHEMA,
    Graph,
    GraphRunner,
    In,
    Kind,
    Options,
    Out,
    Processor,
    QueueDef,
    SimulatedCrash,
    UnhandledStepError,
)
from cues_platform.processing.contracts import split_by_contract
from cues_platform.queues import SchemaError

PAYMENT = pa.schema([pa.field("id", pa.int64(), nullable=False), ("amount", pa.float64()), ("currency", pa.string())])
CONTRACT = pda.DataFrameSchema({
    "amount": pda.Column(float, pda.Check.ge(0)),
    "currency": pda.Column(str, pda.Check.isin(["EUR", "USD"])),
})


def passthrough(ctx, src):
    return src.select("id", "amount", "currency")


def graph(*, errors: bool = True) -> Graph:
    queues = [QueueDef("incoming", PAYMENT), QueueDef("checked", PAYMENT, contract=CONTRACT)]
    if errors:
        queues.append(QueueDef("errors", ERROR_SCHEMA))
    return Graph.build(name="c", queues=queues, error_queue="errors" if errors else None, processors=[
        Processor("check", Kind.MAP, passthrough, {"src": In("incoming")}, {"out": Out("checked")},
                  options=Options(batch_size=5))])


def load(lake) -> None:
    lake.queue("incoming").append({
        "id": list(range(10)),
        "amount": [1.0, -5.0, 2.0, 3.0, 4.0, 5.0, 6.0, -1.0, 8.0, 9.0],
        "currency": ["EUR", "EUR", "JPY", "USD", "EUR", "EUR", "USD", "XXX", "EUR", "USD"],
    }, partition="0")


def test_split_names_the_failed_checks() -> None:
    table = pa.table({"amount": [1.0, -1.0], "currency": ["EUR", "JPY"]})
    good, bad, reasons = split_by_contract(table, CONTRACT, queue="q")
    assert good["amount"].to_pylist() == [1.0]
    assert bad["currency"].to_pylist() == ["JPY"]
    assert "amount" in reasons[0] and "greater_than_or_equal_to" in reasons[0] and "isin" in reasons[0]
    with pytest.raises(SchemaError):
        split_by_contract(pa.table({"other": [1]}), CONTRACT, queue="q")


def _check(lake) -> None:
    assert sorted(lake.queue("checked").read_arrow(partition="0")["id"].to_pylist()) == [0, 3, 4, 5, 6, 8, 9]
    errors = lake.queue("errors").read_arrow(partition="0").sort_by("_offset")
    payloads = [json.loads(p)["id"] for p in errors["payload"].to_pylist()]
    assert payloads == [1, 2, 7]
    assert set(errors["queue"].to_pylist()) == {"checked"}
    assert all("breaks the contract" in m for m in errors["message"].to_pylist())
    # Good rows and their errors were delivered by the same step: same hash.
    checked = lake.queue("checked").read_arrow(partition="0")
    hash_of = dict(zip(checked["id"].to_pylist(), checked["_delivery_hash"].to_pylist(), strict=True))
    assert errors["_delivery_hash"].to_pylist()[0] == hash_of[0]


def test_bad_rows_go_to_the_error_queue_exactly_once_even_after_a_crash(spark, lake) -> None:
    g = graph()
    seen = {"n": 0}

    def crash_once(point: str) -> None:
        if point == "between_commits":
            seen["n"] += 1
            if seen["n"] == 1:
                raise SimulatedCrash("between the output and the error queue commit")

    runner = GraphRunner(graph=g, lake=lake, spark=spark, hook=crash_once)
    load(lake)
    with pytest.raises(SimulatedCrash):
        runner.run_until_idle()
    GraphRunner(graph=g, lake=lake, spark=spark).run_until_idle()
    _check(lake)
    report = audit(lake)
    assert report.ok, report.to_text()


def test_without_an_error_queue_a_contract_break_stops_the_processor(spark, lake) -> None:
    runner = GraphRunner(graph=graph(errors=False), lake=lake, spark=spark)
    load(lake)
    with pytest.raises(UnhandledStepError, match="contract"):
        runner.run_until_idle()
    assert lake.queue("checked").count() == 0
