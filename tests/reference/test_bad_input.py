"""Bad input lands where docs/reference-pipeline.md says, once: never lost, never doubled.

Hand-made postings on a tmp lake, processed by the payments graph on the session's Spark with a
real PostgreSQL ledger, then processed again (a re-run) to show nothing moves the second time.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest

from cues_platform.audit import audit
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from cues_platform.reference import model as m
from cues_platform.reference.generator import TrafficSpec, directory
from cues_platform.reference.job import CONTRACT_VIOLATION, contract_breaks, process, reconcile
from cues_platform.reference.ledger import totals
from cues_platform.reference.pipeline import payments_graph
from cues_platform.reference.report import read_results

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)


def posting(message_id: str | None, *, sender: str = "bank-a", receiver: str = "bank-b", replays: int = 0,
            minutes: int = 0, payload: dict | str | None = None, skew: bool = False, **fields: Any) -> dict:
    body = {"debtor_account": f"{sender}-0001", "creditor_account": f"{receiver}-0001", "amount": "100.00",
            "currency": "EUR", "value_date": "2026-11-20", "reference": "INV-1"} | fields
    at = T0 + timedelta(minutes=minutes)
    return {"message_id": message_id, "sender": sender, "receiver": receiver, "replays": replays,
            "inception_datum": at + timedelta(hours=1) if skew else at, "last_datum": at,
            "payload": payload if isinstance(payload, str) else json.dumps(body)}


# (posting, where it must land, reason) in the order posted to subject bank-b
CASES = [
    (posting("a-1"), "results", m.OK),
    (posting("a-1", replays=1, minutes=1), "results", m.DUPLICATE_MESSAGE_ID),  # same id again
    (posting("a-2", minutes=2, payload='{"debtor_account": "bank-a-0001", '), "malformed", m.PAYLOAD_NOT_JSON),
    (posting(None, minutes=3), "malformed", m.MISSING_MESSAGE_ID),
    (posting("x-1", sender="bank-x", minutes=4), "malformed", m.UNKNOWN_PARTICIPANT),
    (posting("a-3", minutes=5, amount="12,50"), "malformed", m.BAD_AMOUNT),
    (posting("a-4", minutes=6, skew=True), "errors", "last_datum_not_before_inception"),  # contract break
    (posting("a-5", minutes=7, creditor_account="bank-b-9999"), "results", m.UNKNOWN_ACCOUNT),
    (posting("a-6", minutes=8, currency="XAU"), "results", m.BAD_CURRENCY),
    (posting("a-7", minutes=9, amount="90000000.00"), "results", m.INSUFFICIENT_FUNDS),
    (posting("a-8", minutes=10, amount="250.00"), "results", m.OK),
]


@pytest.fixture
def processed(tmp_path, spark, ledger_db) -> tuple[Lake, Any]:
    lake = Lake(root=str(tmp_path / "lake"))
    graph = payments_graph(batch_size=100)
    create_queues(graph, lake)
    lake.queue("accounts").producer(producer_id="directory").send(directory(TrafficSpec()), partition="0",
                                                                  sequence=0)
    postings = lake.queue("postings")
    gateway = postings.producer(producer_id="gateway-test")
    gateway.send(pa.Table.from_pylist([c[0] for c in CASES], schema=m.POSTINGS), partition="bank-b", sequence=0)
    # the acknowledgement was lost: the gateway sends the same batch again, same sequence
    assert gateway.send(pa.Table.from_pylist([c[0] for c in CASES], schema=m.POSTINGS), partition="bank-b",
                        sequence=0).duplicate
    process(graph, lake, spark=spark, ledger=ledger_db)
    return lake, graph


def landings(lake: Lake) -> dict[int, list[tuple[str, str | None]]]:
    """posting offset on subject bank-b → every place it landed (queue, status/reason)."""
    out: dict[int, list[tuple[str, str | None]]] = {}
    results = read_results(lake, columns=["posting_partition", "posting_offset", "status", "reason"])
    for p, o, s, r in zip(*(results[c].to_pylist() for c in results.column_names), strict=True):
        assert p == "bank-b"
        out.setdefault(o, []).append(("results", r if s == m.REJECTED else m.OK))
    malformed = lake.queue("malformed").read_arrow(partition="0")
    for o, r in zip(malformed["posting_offset"].to_pylist(), malformed["reason"].to_pylist(), strict=True):
        out.setdefault(o, []).append(("malformed", r))
    errors = lake.queue("errors").read_arrow(partition="0")
    for kind, queue, payload, message in zip(errors["exception_type"].to_pylist(), errors["queue"].to_pylist(),
                                             errors["payload"].to_pylist(), errors["message"].to_pylist(),
                                             strict=True):
        assert kind == CONTRACT_VIOLATION and queue == "instructions", message
        row = json.loads(payload)
        check = "last_datum_not_before_inception" if "last_datum_not_before_inception" in message else message
        out.setdefault(row["posting_offset"], []).append(("errors", check))
    return out


def test_each_bad_input_lands_once_where_the_docs_say(processed, ledger_db) -> None:
    lake, graph = processed
    assert lake.queue("postings").count() == len(CASES)  # the resend wrote nothing
    landed = landings(lake)
    assert sorted(landed) == list(range(len(CASES)))  # none lost
    for offset, (_, where, reason) in enumerate(CASES):
        assert landed[offset] == [(where, reason)], (offset, landed[offset])  # once, in the right place
    # the contract break is named in its error row, with the posting as JSON
    errors = lake.queue("errors").read_arrow(partition="0")
    assert errors.num_rows == 1
    assert "contract of queue 'instructions'" in errors["message"][0].as_py()
    assert json.loads(errors["payload"][0].as_py())["message_id"] == "a-4"
    # only the two OK postings are booked in PostgreSQL, once
    t = totals(ledger_db)
    assert (t.entries, t.amount) == (2, m.money("350.00")) and t.balanced
    rec = reconcile(lake, ledger=ledger_db)
    assert rec.exact, rec.problems
    assert (rec.ok, sum(rec.rejected.values()), sum(rec.malformed.values()), rec.contract_breaks) == (2, 4, 4, 1)
    assert contract_breaks(lake) == ([("bank-b", 6)], 0)
    assert audit(lake, graph=graph).ok


def test_reprocessing_bad_input_never_doubles(processed, spark, ledger_db) -> None:
    lake, graph = processed
    ends = {q: lake.queue(q).end_offsets() for q in graph.queues}  # fences add no row
    before = totals(ledger_db)
    stats = process(graph, lake, spark=spark, ledger=ledger_db)
    assert sum(s.steps - s.recovered for s in stats.values()) == 0  # recovery only
    assert {q: lake.queue(q).end_offsets() for q in graph.queues} == ends
    assert totals(ledger_db) == before
    assert all(len(v) == 1 for v in landings(lake).values())
