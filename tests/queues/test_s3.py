"""A lake on S3: the queue layer, producers, tailers, transactions, the delta-rs side of processor
steps and `cues audit`, on moto's S3 server (127.0.0.1, its own process: tests/queues/moto_s3.py).

Concurrent writers are safe on S3 the way delta-rs 1.x documents it: each commit entry is written
with S3's conditional write (``If-None-Match: *``), so of two writers of one version the second is
refused and retries. These tests prove it with real processes, prove what a store that ignores the
condition does (a lost commit), and that the platform's probe refuses such a store. Spark reading
``s3://`` needs hadoop-aws, which pip's pyspark lacks: steps that read inputs through Spark are
not run here (docs/deployment.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cues_platform.queues import (
    InvalidNameError,
    Lake,
    Producer,
    StorageUnreachableError,
    Tailer,
    TransactionalProducer,
    read_arrow,
)
from cues_platform.queues.appender import append_batches
from tests.queues.conftest import S3Server, start_s3
from tests.support import PAYLOAD, ROOT, rows

APPENDER = Path(__file__).with_name("s3_appender.py")


def offsets_and_ids(queue, partition: str = "0") -> tuple[list[int], list[int]]:
    table = read_arrow(queue, partition=partition)
    return table["_offset"].to_pylist(), table["id"].to_pylist()


# -- the queue layer --------------------------------------------------------------------------------
def test_queues_producers_tailers_and_transactions_on_s3(s3_lake) -> None:
    lake = s3_lake()
    assert not lake.is_local and lake.root.startswith("s3://")
    orders = lake.create_queue("orders", schema=PAYLOAD, partitions=("0", "1"))
    assert orders.append(rows(0, 3), partition="0").ranges == {"0": (0, 3)}
    assert orders.append(rows(3, 2), partition="0").ranges == {"0": (3, 5)}
    assert orders.append(rows(100, 1), partition="1").ranges == {"1": (0, 1)}
    # a fresh Lake (another process's view) sees the same queue, listed through the object store
    again = Lake(root=lake.root, storage_options=lake.options)
    assert again.list_queues() == ["orders"] and again.has_queue("orders")
    assert offsets_and_ids(again.queue("orders")) == ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4])
    # names stay validated on a URI lake: nothing climbs out of the bucket's lake folder
    for bad in ("../escape", "a/b", "x\n"):
        with pytest.raises(InvalidNameError):
            lake.queue_uri(bad)

    # an idempotent producer: a resend of a committed sequence is a no-op with the same offsets
    producer = Producer(orders, producer_id="shop-1")
    first = producer.send(rows(10, 2), partition="1")
    resend = Producer(again.queue("orders"), producer_id="shop-1").send(rows(10, 2), partition="1", sequence=0)
    assert resend.duplicate and resend.ranges == first.ranges == {"1": (1, 3)}
    assert offsets_and_ids(orders, "1") == ([0, 1, 2], [100, 10, 11])

    # a tailer's position is durable in the lake (_cues/positions on S3)
    tailer = Tailer(queue=orders, name="billing", partition="0")
    assert tailer.read_arrow(max_messages=3)["id"].to_pylist() == [0, 1, 2]
    tailer.commit()
    resumed = Tailer(queue=again.queue("orders"), name="billing", partition="0")
    assert resumed.position == 3 and resumed.read_arrow()["id"].to_pylist() == [3, 4]

    # a transaction over two queues: invisible to read_committed until committed; an abort hides
    payments = lake.create_queue("payments", schema=PAYLOAD)
    txn = TransactionalProducer(lake, transactional_id="t-s3")
    txn.init_transactions()
    txn.begin()
    txn.send(orders, rows(200, 2), partition="0")
    txn.send(payments, rows(300, 1), partition="0")
    assert read_arrow(orders, partition="0", isolation="read_committed")["id"].to_pylist() == [0, 1, 2, 3, 4]
    txn.commit()
    assert read_arrow(payments, partition="0")["id"].to_pylist() == [300]
    txn.begin()
    txn.send(payments, rows(400, 1), partition="0")
    txn.abort()
    payments.append(rows(500, 1), partition="0")
    assert read_arrow(payments, partition="0", isolation="read_committed")["id"].to_pylist() == [300, 500]
    assert read_arrow(payments, partition="0", isolation="read_uncommitted")["id"].to_pylist() == [300, 400, 500]


# -- concurrent writers -----------------------------------------------------------------------------
def test_two_appender_processes_on_s3_keep_offsets_dense(s3_server: S3Server, s3_lake) -> None:
    """Two processes append to one partition. First ROUNDS forced races: both hold the same
    snapshot, then both commit; S3's conditional write refuses the second, which retries on top.
    Then FREE unsynchronized sends each. Offsets are dense, every batch is there exactly once."""
    rounds, free = 3, 5
    lake = s3_lake()
    queue = lake.create_queue("orders", schema=PAYLOAD)
    env = {**os.environ, "CUES_TEST_S3_OPTIONS": json.dumps(lake.options), "PYTHONPATH": str(ROOT)}
    writers = [subprocess.Popen([sys.executable, str(APPENDER), lake.root, str(w), str(rounds), str(free)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
               for w in (1, 2)]

    def say(proc: subprocess.Popen[str], line: str) -> None:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    def hear(proc: subprocess.Popen[str]) -> list[str]:
        line = proc.stdout.readline()
        assert line, f"appender exited ({proc.wait()})"
        return line.split()

    try:
        assert [hear(p) for p in writers] == [["READY"], ["READY"]]
        for _ in range(rounds):
            for p in writers:
                say(p, "round")
            snaps = [hear(p) for p in writers]
            assert snaps[0][0] == "SNAP" and snaps[0] == snaps[1]  # both hold the same version
            for p in writers:
                say(p, "GO")
            done = sorted((int(s), int(e), int(a)) for _, s, e, a in (hear(p) for p in writers))
            # one won the version; the other was refused by the store and retried on top of it
            assert [a == 1 for *_, a in done] == [True, False]
            assert done[0][1] == done[1][0]  # adjacent, no gap, no overlap
        for p in writers:
            say(p, "free")
        frees = [hear(p) for p in writers]
        assert all(f[0] == "FREE" for f in frees)
        assert [p.wait(timeout=120) for p in writers] == [0, 0]
    finally:
        for p in writers:
            if p.poll() is None:
                p.kill()
                p.wait()
    offsets, ids = offsets_and_ids(lake.queue("orders"))
    per_writer = (rounds + free) * 3
    assert offsets == list(range(2 * per_writer))  # dense from 0
    expected = {w * 1_000_000 + i for w in (1, 2) for i in range(per_writer)}
    assert sorted(ids) == sorted(expected)  # nothing lost, nothing twice
    for w in (1, 2):  # each writer's rows in its own order
        mine = [i for i in ids if i // 1_000_000 == w]
        assert mine == sorted(mine)
    assert queue.refresh().transaction_version("part:0") == 2 * per_writer


def test_moto_refuses_a_second_conditional_put_and_the_ignoring_variant_does_not(s3_server) -> None:
    """What the concurrency tests stand on: the server refuses ``If-None-Match: *`` on an existing
    key (S3's conditional write, which delta-rs 1.x sends for each commit entry). The variant
    that drops the header (an S3-compatible store without conditional writes) accepts it."""
    import boto3
    from botocore.exceptions import ClientError

    ignoring = start_s3("ignored")
    try:
        for server, refused in ((s3_server, True), (ignoring, False)):
            client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                                  aws_access_key_id="testing", aws_secret_access_key="testing")
            bucket = server.create_bucket()
            key = "lake/queues/orders/_delta_log/00000000000000000001.json"
            client.put_object(Bucket=bucket, Key=key, Body=b"first", IfNoneMatch="*")
            if refused:
                with pytest.raises(ClientError, match="PreconditionFailed"):
                    client.put_object(Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*")
            else:
                client.put_object(Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*")
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            assert body == (b"first" if refused else b"second")
    finally:
        ignoring.stop()


# -- processor steps (the delta-rs side) and the audit ------------------------------------------------
def test_source_steps_backing_queue_staging_and_cues_audit_on_s3(s3_server, s3_lake) -> None:
    from cues_platform.audit import audit
    from cues_platform.cli import main
    from cues_platform.processing.backing import BackingQueue, Range, Record, RecordType, Snapshot
    from cues_platform.processing.graph import Graph, Kind, Out, Processor, QueueDef
    from cues_platform.processing.outputs import (
        commit_staged,
        delivered_to,
        read_staged,
        remove_staging,
        stage,
    )
    from cues_platform.processing.runner import create_queues
    from cues_platform.processing.sources import SourceStepper

    lake = s3_lake()
    # a source processor runs on S3 with no Spark: its outputs, its step counter (positions)
    plan = {0: 3, 1: 2}
    graph = Graph.build(name="src", queues=[QueueDef("out", PAYLOAD)], processors=[
        Processor("feed", Kind.SOURCE, lambda ctx: rows(100 * ctx.step, plan[ctx.step]) if ctx.step in plan else None,
                  {}, {"out": Out("out")})])
    create_queues(graph, lake)

    def run() -> list[int]:
        stepper = SourceStepper(graph=graph, processor=graph.processors["feed"], lake=lake, spark=None)
        stepper.recover()
        steps = []
        while (result := stepper.step()) is not None:
            steps.append(result.step)
        return steps

    assert run() == [0, 1]
    plan[2] = 1
    assert run() == [2]  # a restart neither repeats nor skips a step
    assert offsets_and_ids(lake.queue("out")) == ([0, 1, 2, 3, 4, 5], [0, 1, 2, 100, 101, 200])

    # the auditor and `cues audit` read the lake through the object store
    report = audit(lake)
    assert report.ok, report.to_text()
    assert report.queues_not_checked == ("out",)  # a source's queue: no exactly-once writer
    result = CliRunner().invoke(main, ["audit", "--lake", lake.root], env=lake.options)
    assert result.exit_code == 0, result.output
    assert f"audit of lake {lake.root}: OK" in result.output
    listed = CliRunner().invoke(main, ["queue", "ls", "--lake", lake.root], env=lake.options)
    assert listed.exit_code == 0 and "out" in listed.output, listed.output

    # an exactly-once step's records and outputs, without the Spark read: snapshot, staged
    # outputs on S3, attempt, commit with the delivery hash, staging removed; a second commit of
    # the same step is a no-op
    backing = BackingQueue(lake, "enrich")
    epoch = backing.fence()
    snap = Snapshot("enrich", 0, {"orders": Range("out", "0", 0, 6)})
    backing.append(Record(RecordType.SNAPSHOT, snap, epoch))
    staged = stage(lake, snap, {"out": {"0": rows(900, 2)}})
    assert staged["out"]["0"].startswith(lake.root + "/_cues/staging/enrich/")
    assert read_staged(staged["out"], lake.options)["0"]["id"].to_pylist() == [900, 901]
    backing.append(Record(RecordType.ATTEMPT_OUTPUT, snap, epoch, staged))
    out = lake.queue("out")
    assert commit_staged(lake, out, snap, staged["out"]).ranges == {"0": (6, 8)}
    assert delivered_to(out, "enrich", 0)
    remove_staging(lake, snap)
    with pytest.raises(OSError):
        read_staged(staged["out"], lake.options)
    assert commit_staged(lake, out, snap, staged["out"]).duplicate  # no re-read, no second copy
    assert backing.last_record().type is RecordType.ATTEMPT_OUTPUT
    assert offsets_and_ids(out)[1][-2:] == [900, 901]


# -- storage faults ---------------------------------------------------------------------------------
FAST_FAIL = {"max_retries": "1", "retry_timeout": "2s", "connect_timeout": "1s", "timeout": "5s"}


def test_an_unreachable_store_is_one_typed_line_and_a_failed_send_stays_pending() -> None:
    server = start_s3()
    try:
        lake = Lake(root=f"s3://{server.create_bucket()}/lake", storage_options=server.options(**FAST_FAIL))
        queue = lake.create_queue("orders", schema=PAYLOAD)
        producer = Producer(queue, producer_id="p1")
        producer.send(rows(0, 2), partition="0")

        # the store goes away between the append's snapshot and its commit
        def stop_the_store(_dt) -> None:
            server.stop()

        with pytest.raises(StorageUnreachableError) as info:
            append_batches(queue, {"0": rows(2, 1)}, guards=[stop_the_store])
    finally:
        server.stop()
    error = info.value
    assert error.retryable and error.during == "commit" and error.endpoint == server.endpoint
    message = str(error)
    assert "\n" not in message and "\x1b" not in message
    assert message.startswith("queue 'orders': the object store at http://127.0.0.1:")
    assert "committing" in message and "resend the same batch" in message and "AWS_ENDPOINT_URL" in message

    for call, during in [(lambda: lake.queue("orders"), "open"), (queue.refresh, "refresh"),
                         (lake.list_queues, "list"),
                         (lambda: producer.send(rows(2, 1), partition="0"), "refresh")]:
        with pytest.raises(StorageUnreachableError) as info:
            call()
        assert info.value.during == during and "\n" not in str(info.value)

    from cues_platform.cli import main

    result = CliRunner().invoke(main, ["audit", "--lake", lake.root], env=lake.options)
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "did not answer" in lines[0], result.output    # the failed send was not acknowledged and is not forgotten: the producer accepts only the
    # same batch again (sequence 1), so it can never be skipped or sent twice under two sequences
    assert producer.pending_sequence == 1
