"""The registry of app-transaction ids (queues/layout.py) against what the queue layer writes.

A workload touching every writer of the queue layer (append, idempotent producer, transactional
producer and its coordinator, tailers, retention) runs on a real lake; every app transaction then
found in the Delta logs must match a registry entry for that table, and carry ``lastUpdated``
exactly when the registry says it may expire. The processing layer's ids are checked the same way
in tests/processing/test_app_ids.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cues_platform.devtools.pages import APP_TRANSACTIONS, app_transactions_page
from cues_platform.queues import Lake, TransactionalProducer
from cues_platform.queues.coordinator import abort_transaction
from cues_platform.queues.layout import (
    APP_IDS,
    COORDINATOR,
    POSITIONS,
    QUEUE,
    AppId,
    expires,
)
from cues_platform.queues.retention import delete_below
from tests.support import rows


def logged_app_transactions(table: Path) -> list[dict]:
    """Every ``txn`` action of every commit entry of the Delta table at ``table``."""
    found = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                found.append(action["txn"])
    return found


def entry_for(app_id: str, table: str) -> AppId:
    """The registry entry of ``app_id`` in a table of kind ``table`` (exactly one must match)."""
    matching = [a for a in APP_IDS if a.table == table and app_id.startswith(a.prefix)
                and len(app_id) > len(a.prefix)]
    assert len(matching) >= 1, f"{app_id!r} in a {table} table is in no registry entry"
    return matching[0]


def test_every_app_id_the_queue_layer_writes_is_registered_with_its_expiry(lake: Lake) -> None:
    orders = lake.create_queue("orders", schema=rows(0, 1).schema, partitions=["a", "b"])
    orders.append(rows(0, 5), partition="a")
    producer = orders.producer(producer_id="p1")
    producer.send(rows(5, 3), partition="b")
    txp = TransactionalProducer(lake, transactional_id="t1")
    txp.init_transactions()
    txp.begin()
    txp.send(orders, rows(8, 2), partition="a")
    txp.commit()
    stalled = TransactionalProducer(lake, transactional_id="t2")
    stalled.init_transactions()
    abort_transaction(lake, stalled.begin())  # an operator's abort: why:{txn id}
    tailer = orders.tailer("reader", partition="a", expendable=True)
    tailer.read_arrow(3)
    tailer.commit()
    delete_below(orders, {"a": 2})

    tables = {QUEUE: Path(orders.uri), COORDINATOR: Path(lake.system_uri("transactions")),
              POSITIONS: Path(lake.system_uri("positions"))}
    seen: set[str] = set()
    for kind, path in tables.items():
        actions = logged_app_transactions(path)
        assert actions, f"the workload wrote no app transaction to the {kind} table"
        for txn in actions:
            entry = entry_for(txn["appId"], kind)
            seen.add(f"{entry.prefix}@{entry.table}")
            assert ("lastUpdated" in txn) == entry.expiring, (txn, entry)
            assert expires(txn["appId"]) == entry.expiring or entry.table != QUEUE, (txn, entry)
    # the workload reached every queue-layer entry of the registry
    queue_layer = {f"{a.prefix}@{a.table}" for a in APP_IDS if a.owner.startswith("queues/")}
    assert queue_layer <= seen, f"not written by the workload: {sorted(queue_layer - seen)}"


def test_an_app_id_is_built_from_exactly_its_named_parts() -> None:
    tailer_position = next(a for a in APP_IDS if a.table == POSITIONS and a.prefix == "pos:")
    assert tailer_position.id("orders", "reader", "a") == "pos:orders/reader/a"
    with pytest.raises(TypeError, match="takes 3 part"):
        tailer_position.id("orders", "a")


def test_the_app_transactions_page_is_generated_from_the_registry() -> None:
    assert APP_TRANSACTIONS.read_text() == app_transactions_page(), (
        "docs/app-transactions.md is stale: run python -m cues_platform.devtools.pages --write")
