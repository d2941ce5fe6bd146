"""A concurrent appender for tests/queues/test_s3.py, run as its own process.

``python tests/queues/s3_appender.py ROOT WRITER ROUNDS FREE`` with the storage options as JSON
in $CUES_TEST_S3_OPTIONS. Talks with the test by lines (no sleeps): prints ``READY``; then for
each of ROUNDS forced races: reads ``round``, takes its snapshot, prints ``SNAP <version>``,
waits for ``GO`` (the other writer holds the same snapshot), commits and prints
``DONE <start> <end> <attempts>``; then reads ``free``, sends FREE batches with an idempotent
producer as fast as it can against the other writer and prints ``FREE <attempts>``.
Every row is ``id = WRITER * 1_000_000 + n``, ``note = "<writer>:<n>"``.
"""

from __future__ import annotations

import json
import os
import sys

import pyarrow as pa

from cues_platform.queues import Lake, Producer
from cues_platform.queues.appender import append_batches


def batch(writer: int, n: int, size: int = 3) -> pa.Table:
    ids = [writer * 1_000_000 + n * size + i for i in range(size)]
    return pa.table({"id": pa.array(ids, pa.int64()), "note": [f"{writer}:{i}" for i in ids]})


def main() -> None:
    root, writer, rounds, free = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    lake = Lake(root=root, storage_options=json.loads(os.environ["CUES_TEST_S3_OPTIONS"]))
    queue = lake.queue("orders")
    print("READY", flush=True)
    for r in range(rounds):
        assert sys.stdin.readline().strip() == "round"
        first = [True]

        def hold(dt, first=first):  # runs after the snapshot, before the commit
            if first[0]:
                first[0] = False
                print(f"SNAP {dt.version()}", flush=True)
                assert sys.stdin.readline().strip() == "GO"

        res = append_batches(queue, {"0": batch(writer, r)}, guards=[hold])
        start, end = res.ranges["0"]
        print(f"DONE {start} {end} {res.attempts}", flush=True)
    assert sys.stdin.readline().strip() == "free"
    producer = Producer(queue, producer_id=f"writer-{writer}")
    attempts = sum(producer.send(batch(writer, rounds + i), partition="0").attempts for i in range(free))
    print(f"FREE {attempts}", flush=True)


if __name__ == "__main__":
    main()
