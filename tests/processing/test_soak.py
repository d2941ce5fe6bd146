"""Soak: a 3-processor graph (map -> fork -> sink) run by a child process that the test SIGKILLs
at random moments, restarting it each time; at the end every output row and every side effect is
there exactly once.

A kill is aimed by progress, not by time: after each start the test picks a random number of
further units of progress (backing records of any processor, or steps committed to a home queue)
and kills the child as soon as that many exist, so kills land at random points of the protocol (inside a commit, between
a fork's commits, during recovery, ...). Full size (100,000 messages, 8 kills) with CUES_SOAK=1;
otherwise 3,000 messages and 2 kills, finished in-process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import signal
import subprocess
import sys
from collections import Counter

import pyarrow as pa
import pytest

from cues_platform.processing import GraphRunner
from cues_platform.processing.runner import create_queues
from tests.processing.graphs import (
    SOAK_CHILD,
    SOAK_PIDS,
    SOAK_UNITS_PER_STEP,
    backing_progress,
    build_soak_graph,
    check_backing,
    sink_rows,
)
from tests.support import ROOT, soak_enabled

FULL = soak_enabled()
N = 100_000 if FULL else 3_000
BATCH = 5_000 if FULL else 300
KILLS = 8 if FULL else 2


def start_child(root: str, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SOAK_CHILD, root, str(BATCH)], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.soak
def test_soak_random_sigkills(spark, lake, tmp_path):
    rng = random.Random(int(os.environ.get("CUES_SOAK_SEED", random.randrange(1 << 30))))
    graph = build_soak_graph(BATCH)
    create_queues(graph, lake)
    ids = pa.array(range(N), pa.int64())
    # Several input commits so steps start from different file layouts.
    for lo in range(0, N, N // 4):
        hi = min(N, lo + N // 4)
        lake.queue("a").append(pa.table({"id": ids[lo:hi], "note": [f"n{i}" for i in range(lo, hi)]}),
                               partition="0")
    steps_total = SOAK_UNITS_PER_STEP * (-(-N // BATCH))  # the gauge when all is done
    kills = 0
    log_path = tmp_path / "child.log"
    with open(log_path, "w") as log:
        while kills < KILLS:
            before = backing_progress(lake)
            if before >= steps_total:
                break  # everything is already done
            target = before + rng.randint(1, max(2, (steps_total - before) // 2))
            child = start_child(lake.root, log)
            try:
                while child.poll() is None and backing_progress(lake) < target:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.wait(timeout=0.05)  # a poll interval: the kill is aimed by progress
                if child.poll() is None:
                    child.send_signal(signal.SIGKILL)
                    kills += 1
                rc = child.wait(timeout=60)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            assert rc in (0, -signal.SIGKILL), log_path.read_text()[-3000:]
            if rc == 0:
                break  # the child finished everything by itself: no further kill can land
    assert kills >= 1, "the child finished before any kill: raise N"
    # Finish in-process (the same lake, the test's Spark session).
    GraphRunner(graph=graph, lake=lake, spark=spark, keep_results=False).run_until_idle()

    def bag(q: str) -> Counter:
        return Counter(lake.queue(q).read_arrow(partition="0", columns=["id"])["id"].to_pylist())

    doubled = Counter(i * 2 for i in range(N))
    assert bag("b") == doubled
    assert bag("d") == doubled
    assert bag("c") == Counter(i * 2 + 1 for i in range(N))
    assert lake.queue("errors").count() == 0
    sink = sink_rows(lake)
    assert Counter(sink["id"].to_pylist()) == doubled
    steps = -(-N // BATCH)
    for pid in SOAK_PIDS:
        attempts = check_backing(lake, pid)
        assert sorted(attempts) == list(range(steps))
    # Every sink effect carries the hash of one of the sink's steps, one step per hash.
    sink_attempts = check_backing(lake, "s")
    assert set(sink["hash"].to_pylist()) == {a.hash for a in sink_attempts.values()}
    if importlib.util.find_spec("cues_platform.audit") is not None:
        from cues_platform.audit import audit

        report = audit(lake)
        assert report.ok, report.violations
