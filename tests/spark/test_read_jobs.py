"""A step's read of many data files costs no Spark job of its own (local masters)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cues_platform.queues import Queue
from cues_platform.queues.reader import execute_spark, plan_read

FILES = 40  # over Spark's default parallel-listing threshold of 32 paths


def test_reading_40_files_runs_only_the_job_that_reads_them(spark: Any,
                                                           make_queue: Callable[..., Queue]) -> None:
    queue = make_queue("many_files")
    for i in range(FILES):  # one append, one data file
        queue.append({"id": [i], "note": [f"m{i}"]}, partition="0")
    plan = plan_read(queue, partition="0", start=0, end=FILES)
    assert len(plan.files) == FILES
    sc = spark.sparkContext
    sc.setJobGroup("read-40-files", "the read of a step")
    try:
        rows = execute_spark(queue, spark, plan).toArrow()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert sorted(rows["_offset"].to_pylist()) == list(range(FILES))
    jobs = sc.statusTracker().getJobIdsForGroup("read-40-files")
    # Spark's default lists more than 32 paths with a job of its own before the read: 2 jobs.
    assert len(jobs) == 1, f"{len(jobs)} Spark jobs for one read of {FILES} files"
