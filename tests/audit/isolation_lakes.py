"""The isolation audit tests' lake: real steps that isolate failing rows, a whole-step failure, and
replays of error rows (one fixed, one failing again), built once per test session; private copies
to tamper with (the fixtures are in test_isolated.py).

Graph ``iso`` over queue ``a`` (partition 0, ids 0..39, batches of 10), error queue ``errors``;
both processors raise while their input holds a poison id (3, 4, 25, 35):

- ``p`` (map a -> b, ``OnError.ISOLATE``, the default) isolates: step 0 [0, 10) writes error
  rows for ids 3 and 4, step 2 [20, 30) for id 25, step 3 [30, 40) for id 35, and delivers the rest;
- ``q`` (map a -> c, ``OnError.WHOLE_STEP``) writes one whole-step error row for each of its steps
  0, 2 and 3.

Then the user fixes 3, 25 and 35 (4 still fails) and replays both: ``p``'s replay steps deliver
3, 25, 35 and fail again on 4 (a new isolated row, pending); ``q``'s deliver [20, 30) and [30, 40)
and fail again on [0, 10) (a new whole-step row, pending). Error queue by offset: 0 p/0 id 3,
1 p/0 id 4, 2 q/0 [0, 10), 3 p/2 id 25, 4 q/2 [20, 30), 5 p/3 id 35, 6 q/3 [30, 40), 7 p/5 id 4
(replay), 8 q/4 [0, 10) (replay); every row but 7 and 8 is replayed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from cues_platform.processing import (
    ERROR_SCHEMA,
    BackingQueue,
    Graph,
    GraphRunner,
    In,
    Kind,
    OnError,
    Options,
    Out,
    Processor,
    QueueDef,
    Range,
    Record,
    RecordType,
)
from cues_platform.processing.backing import ErrorRef, Snapshot
from cues_platform.processing.history import processor_history
from cues_platform.processing.outputs import error_table
from cues_platform.processing.replay import replay_errors
from cues_platform.queues import Lake
from cues_platform.queues.layout import PROCESSOR_STEP
from tests.support import PAYLOAD, rows

ROWS = 40
POISON = frozenset({3, 4, 25, 35})
STILL_FAILING = frozenset({4})  # after the fix


def iso_graph(poison: set[int]) -> Graph:
    """``p`` and ``q`` (module docstring); they raise while their input holds an id of ``poison``
    (the set the fixture shrinks to "fix the function")."""

    def fn(ctx, src):
        ids = set(src.select("id").toArrow()["id"].to_pylist())
        if ids & poison:
            raise ValueError(f"poison ids {sorted(ids & poison)}")
        return src

    opts = {"batch_size": 10, "max_batch_size": 10}
    queues = [QueueDef("a", PAYLOAD), QueueDef("b", PAYLOAD), QueueDef("c", PAYLOAD),
              QueueDef("errors", ERROR_SCHEMA)]
    return Graph.build(name="iso", queues=queues, error_queue="errors", processors=[
        Processor("p", Kind.MAP, fn, {"src": In("a", "0")}, {"out": Out("b", "0")},
                  options=Options(**opts)),
        Processor("q", Kind.MAP, fn, {"src": In("a", "0")}, {"out": Out("c", "0")},
                  options=Options(**opts, on_error=OnError.WHOLE_STEP)),
    ])


def build_isolated_lake(spark: object, root: Path) -> Lake:
    lake = Lake(root=str(root))
    poison = set(POISON)
    graph = iso_graph(poison)
    runner = GraphRunner(graph=graph, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, ROWS), partition="0")
    runner.run_until_idle()
    poison.intersection_update(STILL_FAILING)  # the user fixed the function (partly)
    replay_errors(graph=graph, processor="p", lake=lake, spark=spark)
    replay_errors(graph=graph, processor="q", lake=lake, spark=spark)
    return lake


def error_rows_of(lake: Lake) -> list[dict]:
    return lake.queue("errors").read_arrow(partition="0").to_pylist()


def forge_step(lake: Lake, processor: str, inputs: dict[str, Range], *,
               replay: ErrorRef | None = None, errors: list[dict] | None = None,
               kind: RecordType | None = None) -> Snapshot:
    """What a buggy platform would write: the next step of ``processor`` (snapshot + attempt in
    its backing queue) and, when ``errors`` is given, those error rows (column overrides of
    :func:`error_table`'s row for the step) committed to ``errors`` with the step's hash and
    ``proc:`` app transaction, as a step commits them (delta-rs, through the queue)."""
    backing = BackingQueue(lake, processor)
    epoch = backing.epoch()
    step = processor_history(lake, processor)[-1].step + 1
    snapshot = Snapshot(processor, step, inputs, None, replay=replay)
    outputs = {"rows": {"errors": {"0": len(errors)}}} if errors else {}
    kind = kind or (RecordType.ATTEMPT_ERROR if errors else RecordType.ATTEMPT_NIL)
    backing.append(Record(RecordType.SNAPSHOT, snapshot, epoch))
    backing.append(Record(kind, snapshot, epoch, outputs))
    if errors:
        base = error_table(snapshot, ValueError("forged")).to_pylist()[0]
        table = pa.Table.from_pylist([{**base, **e} for e in errors], schema=ERROR_SCHEMA)
        lake.queue("errors").append(
            table, partition="0", delivery_hash=snapshot.delivery_hash, message_type="error",
            app_transactions=[(PROCESSOR_STEP.id(processor), step)],
        )
    return snapshot


def narrowed(binding: str, queue: str, offset: int) -> str:
    """An isolated error row's ``inputs``: one binding narrowed to ``[offset, offset + 1)``."""
    return json.dumps({binding: [queue, "0", offset, offset + 1]})
