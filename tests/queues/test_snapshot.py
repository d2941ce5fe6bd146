"""A queue handle's snapshot: refresh sees every newer commit, from any handle or process."""

from __future__ import annotations

from pathlib import Path

from cues_platform.queues import Lake
from cues_platform.queues.layout import QUEUE_CHECKPOINT_INTERVAL, STATS_COLUMNS
from tests.support import PAYLOAD, rows


def test_refresh_sees_commits_of_other_handles_and_processes(lake, run_python) -> None:
    a = lake.create_queue("q", schema=PAYLOAD)
    b = Lake(root=lake.root).queue("q")
    a.append(rows(0, 5), partition="0")
    assert b.refresh().version() == a.version()
    assert b.next_offset("0") == 5
    assert b.refresh().version() == a.version()  # nothing new: the same snapshot
    code = (
        "from cues_platform.queues import Lake\n"
        "from tests.support import rows\n"
        f"Lake(root={lake.root!r}).queue('q').append(rows(5, 3), partition='0')\n"
    )
    run_python(code)
    assert b.next_offset("0") == 8
    assert b.read_arrow(partition="0")["id"].to_pylist() == list(range(8))


def test_file_statistics_cover_the_columns_the_queue_prunes_by(lake) -> None:
    q = lake.create_queue("q", schema=PAYLOAD)
    config = q.refresh().metadata().configuration
    assert config["delta.dataSkippingStatsColumns"] == STATS_COLUMNS == "_offset,_txn_id,_append_time"
    q.append(rows(0, 10), partition="0")
    q.append(rows(10, 10), partition="0")
    assert sorted((f.min_offset, f.max_offset, f.rows) for f in q.files(partition="0")) == [(0, 9, 10), (10, 19, 10)]
    assert q.read_arrow(partition="0", start=12, end=15)["id"].to_pylist() == [12, 13, 14]


def test_a_queue_is_checkpointed_every_ten_commits_unless_its_properties_say_otherwise(lake) -> None:
    """A refresh replays the log from the newest checkpoint (delta-rs 1.6), so a queue is
    checkpointed every QUEUE_CHECKPOINT_INTERVAL commits; a queue's own property wins."""
    q = lake.create_queue("q", schema=PAYLOAD)
    own = lake.create_queue("own", schema=PAYLOAD, properties={"delta.checkpointInterval": "25"})
    assert QUEUE_CHECKPOINT_INTERVAL == 10
    assert q.refresh().metadata().configuration["delta.checkpointInterval"] == "10"
    assert own.refresh().metadata().configuration["delta.checkpointInterval"] == "25"
    for i in range(21):
        q.append(rows(i, 1), partition="0")
        own.append(rows(i, 1), partition="0")

    def checkpoints(queue) -> list[int]:
        log = Path(queue.uri.removeprefix("file://")) / "_delta_log"
        return sorted(int(p.name[:20]) for p in log.glob("*.checkpoint.parquet"))

    assert checkpoints(q) == [9, 19]  # the 10th and 20th commits (version 0 is the first)
    assert checkpoints(own) == []
    fresh = Lake(root=lake.root).queue("q")  # opened from the newest checkpoint and one entry
    assert fresh.next_offset("0") == 21
    assert fresh.read_arrow(partition="0")["id"].to_pylist() == list(range(21))
