"""The isolation audit tests' lake: real steps that isolate failing rows, a whole-step failure, and
replays of error rows (one fixed, one failing again), built once per test session; private copies
to tamper with.

Graph ``iso`` over queue ``a`` (partition 0, ids 0..39, batches of 10), error queue ``errors``:

- ``p`` (map a -> b, ``OnError.ISOLATE``, the default) raises while its input holds a poison id:
  step 0 [0, 10) isolates ids 3 and 4 (two error rows), step 2 [20, 30) isolates id 25;
- ``q`` (map a -> c, ``OnError.WHOLE_STEP``) fails its step 3 [30, 40) (id 35) as one error row.

Then the user fixes ids 3, 25 and 35 (4 still fails) and replays: ``p`` replays its three rows
(3 and 25 delivered, 4 fails again: a new error row of the replay step), ``q`` its one row.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

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


@pytest.fixture(scope="session")
def isolated_lake(spark: object, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lake of the module docstring (built once per test session)."""
    base = tmp_path_factory.mktemp("audit_isolated")
    build_isolated_lake(spark, base / "lake")
    return base / "lake"


@pytest.fixture
def iso_copy(isolated_lake: Path, tmp_path: Path) -> Iterator[Lake]:
    """A private copy of the isolated lake, to tamper with."""
    shutil.copytree(isolated_lake, tmp_path / "lake")
    yield Lake(root=str(tmp_path / "lake"))


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
