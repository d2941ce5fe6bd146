"""The error queue asset's observation says what each error row is (issue 27, item 2): counts by
processor and exception, by kind (isolated row, whole step, contract break), and the newest rows
as a markdown table, read from the queue (its newest offsets only for the table)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from dagster import AssetKey, ConfigurableResource, materialize

from cues_platform.dagster import CuesSparkResource, build_definitions
from cues_platform.dagster import error_queues as eq
from cues_platform.processing import (
    ERROR_SCHEMA,
    Graph,
    In,
    Kind,
    Options,
    Out,
    Processor,
    QueueDef,
)
from cues_platform.processing.failures import CONTRACT_EXCEPTION_TYPE
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from tests.dagster.conftest import assets_of, resources_of
from tests.support import PAYLOAD, rows


class Poison(ValueError):
    """What the test function raises while a poison id is in its input."""


class PoisonIds(ConfigurableResource):
    """The ids the test function fails on (a user resource: ``ctx.resources["poison"]``)."""

    ids: list[int] = []


def poisoned(ctx, src):
    """Map ``a -> b``; raises while its input holds an id of the ``poison`` resource."""
    bad = set(ctx.resources["poison"].ids)
    ids = set(src.select("id").toArrow()["id"].to_pylist())
    if ids & bad:
        raise Poison(f"poison ids {sorted(ids & bad)} | see the row")
    return src.select("id", "note")


def poison_graph(name: str = "poisoned") -> Graph:
    queues = [QueueDef("a", PAYLOAD), QueueDef("b", PAYLOAD), QueueDef("errors", ERROR_SCHEMA)]
    proc = Processor("p", Kind.MAP, poisoned, {"src": In("a", "0")}, {"out": Out("b", "0")},
                     options=Options(batch_size=1_000, max_batch_size=1_000))
    return Graph.build(name=name, queues=queues, processors=[proc], error_queue="errors")


def poison_defs(graph: Graph, lake_resource, ids: list[int]):
    return build_definitions(graph, lake=lake_resource, spark=CuesSparkResource(), schedule_cron=None,
                             freshness=None, resources={"poison": PoisonIds(ids=ids)})


def observation(result, key: str = "errors") -> dict:
    (obs,) = [e.event_specific_data.asset_observation for e in result.all_events
              if e.event_type_value == "ASSET_OBSERVATION"
              and e.event_specific_data.asset_observation.asset_key == AssetKey(key)]
    return {k: v.value for k, v in obs.metadata.items()}


def test_a_step_that_isolated_2_rows_of_100_is_observed_row_by_row(lake, lake_resource, instance) -> None:
    graph = poison_graph()
    defs = poison_defs(graph, lake_resource, [13, 57])
    create_queues(graph, lake)
    lake.queue("a").append(rows(0, 100), partition="0")
    result = materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                         selection=[AssetKey("b")])
    assert result.success
    assert sorted(lake.queue("b").read_arrow(partition="0")["id"].to_pylist()) == [
        i for i in range(100) if i not in (13, 57)]
    meta = observation(result)
    poison = f"{__name__}.Poison"
    assert meta["dagster/row_count"] == 2 and meta["cues/rows_from_this_run"] == 2
    assert meta["cues/by_processor"] == {"p": {poison: 2}}
    assert (meta["cues/isolated_rows"], meta["cues/whole_step_rows"], meta["cues/contract_break_rows"]) == (2, 0, 0)
    assert (meta["cues/pending_rows"], meta["cues/replayed_rows"], meta["cues/not_replayable_rows"]) == (2, 0, 0)
    table = meta["cues/newest_rows"].splitlines()
    assert table[0] == "| error row | replayed | processor | step | input | exception | message | row |"
    body = table[2:]
    assert len(body) == 2
    # newest first (one step: the same time, so the higher offset first); each names its input row
    assert body[0].startswith("| errors/0@1 | no | p | 0 | a/0@57 | " + poison + " | ")
    assert body[1].startswith("| errors/0@0 | no | p | 0 | a/0@13 | " + poison + " | ")
    # the user's message (its pipe escaped) and the row itself
    assert "poison ids [57] \\| see the row" in body[0]
    assert body[0].endswith('| {"id": 57, "note": "n57"} |')
    assert body[1].endswith('| {"id": 13, "note": "n13"} |')


def _error_rows(kinds: list[tuple[str, str, str | None, str | None]], *, at: datetime) -> pa.Table:
    """Hand-made error rows ``(processor, exception_type, queue, payload)`` as the platform writes
    them (isolation: payload, no queue; a whole step: neither; a contract break: both)."""
    n = len(kinds)
    return pa.table({
        "processor": [k[0] for k in kinds], "step": list(range(n)),
        "inputs": [json.dumps({"src": ["a", "0", i, i + 1 if k[3] else i + 10]}) for i, k in enumerate(kinds)],
        "exception_type": [k[1] for k in kinds], "message": [f"failed {i}" for i in range(n)],
        "traceback": [""] * n, "failed_at": [at + timedelta(seconds=i) for i in range(n)],
        "queue": [k[2] for k in kinds], "payload": [k[3] for k in kinds],
    }, schema=ERROR_SCHEMA)


def test_counts_by_kind_are_exact_whatever_the_read_chunk(lake: Lake, monkeypatch) -> None:
    """No Spark: the counts of a real error queue of every kind of row, read 7 offsets at a time."""
    queue = lake.create_queue("errors", schema=ERROR_SCHEMA)
    at = datetime(2026, 11, 1, tzinfo=UTC)
    iso = [("p", "x.Boom", None, json.dumps({"id": i})) for i in range(11)]
    whole = [("q", "x.Down", None, None)] * 4
    contract = [("p", CONTRACT_EXCEPTION_TYPE, "b", json.dumps({"id": -1}))] * 6
    queue.append(_error_rows([*iso, *whole, *contract], at=at), partition="0")
    whole_counts = eq.summarize(lake, "errors")
    monkeypatch.setattr(eq, "COUNT_CHUNK", 7)
    chunked = eq.summarize(lake, "errors")
    for summary in (whole_counts, chunked):
        assert summary.kinds == {eq.ISOLATED: 11, eq.WHOLE_STEP: 4, eq.CONTRACT_BREAK: 6}
        assert summary.by_processor == {"p": {"x.Boom": 11, CONTRACT_EXCEPTION_TYPE: 6}, "q": {"x.Down": 4}}
        assert summary.total == 21 and summary.replay is None
    # pending / replayed / not replayable, given the replay log and the lanes replay accepts
    replay = eq.summarize(lake, "errors", replayed={"0": {0, 1, 2}}, replayable_lanes={"p"})
    assert replay.replay == {eq.REPLAYED: 3, eq.PENDING: 8, eq.NOT_REPLAYABLE: 4 + 6}


def test_the_newest_rows_come_from_the_last_offsets_and_read_as_a_table(lake: Lake) -> None:
    queue = lake.create_queue("errors", schema=ERROR_SCHEMA)
    at = datetime(2026, 11, 1, tzinfo=UTC)
    long_row = json.dumps({"id": 7, "note": "x" * 500})
    queue.append(_error_rows([("p", "x.Boom", None, long_row)] * 25, at=at), partition="0")
    newest = eq.newest_error_rows(lake, "errors", count=10)
    assert [r["_offset"] for r in newest] == list(range(24, 14, -1))
    text = eq.rows_markdown("errors", newest, replayed={"0": {24}})
    lines = text.splitlines()
    assert lines[0].startswith("| error row | replayed | processor |") and len(lines) == 12
    first = lines[2].split(" | ")
    assert first[0] == "| errors/0@24" and first[1] == "yes" and lines[3].split(" | ")[1] == "no"
    row = first[-1].removesuffix(" |")
    assert len(row) == eq.PAYLOAD_WIDTH and row.endswith("…") and row.startswith('{"id": 7')
    assert eq.rows_markdown("errors", []) == "Error queue `errors` has no rows."


@pytest.mark.parametrize("message, shown", [
    ("plain message\nsecond line", "plain message"),
    ("Spark says a job failed\nTraceback...\n  File x\nx.Boom: the user's own line", "the user's own line"),
])
def test_the_message_column_is_the_line_that_says_what_failed(lake: Lake, message: str, shown: str) -> None:
    row = {**_error_rows([("p", "x.Boom", None, "{}")], at=datetime(2026, 11, 1, tzinfo=UTC)).to_pylist()[0],
           "message": message, "_partition": "0", "_offset": 0}
    assert eq.rows_markdown("errors", [row]).splitlines()[2].split(" | ")[5] == shown
