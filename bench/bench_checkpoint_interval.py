"""What a queue's checkpoint interval costs its readers and its writer.

Run: ``.venv/bin/python bench/bench_checkpoint_interval.py [--reps 7]``
-> bench/results/checkpoint_interval.json

Why queues are checkpointed every ``layout.QUEUE_CHECKPOINT_INTERVAL`` (10) commits instead of
delta-rs' 100: delta-rs 1.6 replays the log from the newest checkpoint on every refresh and
every ``transaction_version`` lookup. Two measurements, on queues created and appended to
through the platform (``Lake.create_queue``, ``Queue.append``: one ``part:`` app transaction
per commit):

* ``readers``: a queue checkpointed every 100 commits; at 1, 10, 30, 60 and 95 commits after
  its newest checkpoint, a handle one version behind is moved to the newest version
  (``DeltaTable.update_incremental``) and asked one app transaction (``transaction_version``),
  ``--reps`` times each (fresh handles, medians). What every polling process pays per look.
* ``writer``: ``DeltaTable.create_checkpoint`` on a queue holding 1,000, 5,000 and 20,000 live
  files (the files are add actions of one 1-row Parquet file's size and statistics, committed by
  ``create_write_transaction``; a checkpoint reads only the log), after a new commit each time,
  medians of ``--reps``. What the writer whose commit reaches the interval pays, once per interval.
* ``positions``: 400 tailer position commits (``PositionStore.commit``, three tailers in turn) on
  a new positions table created with a checkpoint interval of 100 and of 10
  (``positions.CHECKPOINT_INTERVAL``, which the handle also reopens by), alternating 100, 10,
  100, 10; p50 and mean of the last 350 commits of each.

The end-to-end effect is measured by ``bench_participants.py`` (its JSON files name the
interval in their ``note``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import AddAction

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from common import machine_info, median, now_iso, write_json  # noqa: E402

from cues_platform.queues import Lake  # noqa: E402
from cues_platform.queues.layout import PARTITION as PARTITION_ID  # noqa: E402
from cues_platform.queues.layout import QUEUE_CHECKPOINT_INTERVAL  # noqa: E402

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("body", pa.string())])
SINCE = (1, 10, 30, 60, 95)
LIVE_FILES = (1_000, 5_000, 20_000)


def rows(n: int) -> pa.Table:
    return pa.table({"id": list(range(n)), "body": ["x"] * n}, schema=SCHEMA)


def readers(root: Path, reps: int) -> dict[str, dict[str, float]]:
    lake = Lake(root=str(root / "readers"))
    q = lake.create_queue("q", schema=SCHEMA, properties={"delta.checkpointInterval": "100"})
    app = PARTITION_ID.id("0")
    out: dict[str, dict[str, float]] = {}
    version = q.refresh().version()
    for since in SINCE:
        while version < 100 + since:  # versions 100 .. 195 lie after the checkpoint of version 100
            q.append(rows(10), partition="0")
            version = q.refresh().version()
        refresh, lookup = [], []
        for _ in range(reps):
            dt = DeltaTable(q.uri, version=version - 1)
            t = time.perf_counter()
            dt.update_incremental()
            refresh.append(time.perf_counter() - t)
            t = time.perf_counter()
            dt.transaction_version(app)
            lookup.append(time.perf_counter() - t)
        out[str(since)] = {"refresh_ms": round(median(refresh) * 1000, 2),
                           "transaction_version_ms": round(median(lookup) * 1000, 2)}
        print(f"{since:3d} commits after the checkpoint: refresh {out[str(since)]['refresh_ms']} ms, "
              f"one app transaction {out[str(since)]['transaction_version_ms']} ms", flush=True)
    return out


def writer(root: Path, reps: int) -> dict[str, float]:
    lake = Lake(root=str(root / "writer"))
    q = lake.create_queue("q", schema=SCHEMA, properties={"delta.checkpointInterval": "1000000"})
    q.append(rows(1), partition="0")
    dt = DeltaTable(q.uri)
    action = pa.table(dt.get_add_actions(flatten=True)).to_pylist()[0]
    stats = json.dumps({"numRecords": 1, "minValues": {"_offset": 0}, "maxValues": {"_offset": 0},
                        "nullCount": {"_offset": 0}})
    out: dict[str, float] = {}
    for target in LIVE_FILES:
        have = len(dt.file_uris())
        adds = [AddAction(f"_partition=0/fake-{have + i}.parquet", action["size_bytes"], {"_partition": "0"},
                          0, True, stats) for i in range(target - have)]
        dt.create_write_transaction(adds, mode="append", schema=dt.schema(), partition_by=["_partition"],
                                    commit_properties=CommitProperties())
        dt.update_incremental()
        seconds = []
        for _ in range(reps):
            dt.create_write_transaction([], mode="append", schema=dt.schema(), partition_by=["_partition"])
            dt.update_incremental()
            t = time.perf_counter()
            dt.create_checkpoint()
            seconds.append(time.perf_counter() - t)
        out[str(target)] = round(median(seconds) * 1000, 2)
        print(f"{len(dt.file_uris()):,} live files: checkpoint {out[str(target)]} ms", flush=True)
    return out


def position_commits(root: Path) -> dict[str, list[dict[str, float]]]:
    from cues_platform.queues import positions

    saved = positions.CHECKPOINT_INTERVAL
    out: dict[str, list[dict[str, float]]] = {"100": [], "10": []}
    try:
        for i, interval in enumerate((100, 10, 100, 10)):
            positions.CHECKPOINT_INTERVAL = interval
            store = positions.PositionStore(Lake(root=str(root / f"positions-{i}")))
            seconds = []
            for n in range(400):
                t = time.perf_counter()
                store.commit(queue="q", tailer=f"t{n % 3}", partition="0", position=n)
                seconds.append(time.perf_counter() - t)
            kept = seconds[50:]
            out[str(interval)].append({"p50_ms": round(median(kept) * 1000, 2),
                                       "mean_ms": round(sum(kept) / len(kept) * 1000, 2)})
            print(f"positions at interval {interval}: {out[str(interval)][-1]}", flush=True)
    finally:
        positions.CHECKPOINT_INTERVAL = saved
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "checkpoint_interval.json")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cues-checkpoint-interval-") as tmp:
        read = readers(Path(tmp), args.reps)
        write = writer(Path(tmp), args.reps)
        commits = position_commits(Path(tmp))
    out = {"benchmark": "checkpoint_interval", "at": now_iso(), "machine": machine_info(), "note": args.note,
           "config": {"reps": args.reps, "queue_checkpoint_interval": QUEUE_CHECKPOINT_INTERVAL},
           "readers_by_commits_since_checkpoint": read, "checkpoint_ms_by_live_files": write,
           "position_commits_by_interval": commits}
    print("wrote", write_json(args.out, out))


if __name__ == "__main__":
    main()
