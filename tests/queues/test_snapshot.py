"""A queue handle's snapshot: refresh sees every newer commit, from any handle or process."""

from __future__ import annotations

from cues_platform.queues import Lake
from cues_platform.queues.layout import STATS_COLUMNS
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
