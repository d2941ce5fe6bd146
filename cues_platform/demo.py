"""The main job for now: a queue demo on embedded defaults (local Delta lake, Spark local[*]).

Produces payment postings from three banks with idempotent producers, replays a batch whose
acknowledgement was "lost", moves money between two queues in a transaction (one committed, one
aborted), reads everything back with Spark through tailers, compacts, and checks that every
partition's offsets are dense and that nothing was written twice.
"""

from __future__ import annotations

import random
import time

import pyarrow as pa
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from cues_platform.queues import Lake, TransactionalProducer
from cues_platform.queues.location import reset_local_lake
from cues_platform.queues.maintenance import checkpoint, compact
from cues_platform.spark import get_spark

BANKS = ("bank-a", "bank-b", "bank-c")
POSTING = pa.schema(
    [
        pa.field("message_id", pa.string(), nullable=False),
        pa.field("sender", pa.string(), nullable=False),
        pa.field("amount", pa.float64(), nullable=False),
        pa.field("currency", pa.string(), nullable=False),
    ]
)


def _batch(rng: random.Random, sender: str, start: int, count: int) -> pa.Table:
    return pa.table(
        {
            "message_id": [f"{sender}-{i}" for i in range(start, start + count)],
            "sender": [sender] * count,
            "amount": [round(rng.uniform(1, 5000), 2) for _ in range(count)],
            "currency": [rng.choice(("EUR", "USD", "GBP")) for _ in range(count)],
        },
        schema=POSTING,
    )


def run_demo(*, lake_root: str, messages: int, console: Console) -> bool:
    started = time.monotonic()
    reset_local_lake(lake_root)
    lake = Lake(root=lake_root)
    console.print(f"[bold]cues_platform queue demo[/] — lake at {lake.root}")
    postings = lake.create_queue("postings", schema=POSTING, partitions=BANKS)
    ledger = lake.create_queue("ledger", schema=POSTING, partitions=("main",))
    rng = random.Random(7)
    batch = max(1, min(10_000, messages // 20))
    producers = {bank: postings.producer(producer_id=f"producer-{bank}") for bank in BANKS}
    sent = dict.fromkeys(BANKS, 0)
    last: dict[str, pa.Table] = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("producing postings", total=messages)
        done = 0
        while done < messages:
            receiver = BANKS[(done // batch) % len(BANKS)]
            n = min(batch, messages - done)
            last[receiver] = _batch(rng, receiver, sent[receiver], n)
            producers[receiver].send(last[receiver], partition=receiver)
            sent[receiver] += n
            done += n
            progress.update(task, completed=done)

    # A producer whose acknowledgement was lost sends the same last batch again: a no-op (a
    # different batch under that sequence would raise SequenceMismatchError).
    replay = producers["bank-a"]
    resend = replay.send(last["bank-a"], partition="bank-a", sequence=replay.next_sequence - 1)
    console.print(
        f"resent sequence {replay.next_sequence - 1} of producer-bank-a: "
        f"duplicate={resend.duplicate}, offsets {dict(resend.ranges)}"
    )

    # Transactions across two queues: one committed, one aborted.
    mover = TransactionalProducer(lake, transactional_id="demo-mover")
    mover.init_transactions()
    for outcome in ("commit", "abort"):
        mover.begin()
        mover.send(ledger, _batch(rng, "ledger", 0, 5), partition="main")
        mover.send(postings, _batch(rng, "bank-b", 10_000_000, 5), partition="bank-b")
        mover.commit() if outcome == "commit" else mover.abort()

    from pyspark.sql import functions as F

    console.print("starting Spark (local[*]) ...")
    spark = get_spark()
    summary = Table("partition", "messages", "offsets dense", "amount (sum)")
    ok = True
    for bank in BANKS:
        tailer = postings.tailer("demo-reader", partition=bank)
        frame = tailer.read_spark(spark, max_messages=10_000_000)
        stats = frame.agg(
            F.count("*").alias("n"),
            F.countDistinct("_offset").alias("distinct"),
            F.max("_offset").alias("max"),
            F.sum("amount").alias("amount"),
        ).collect()[0]
        expected = sent[bank] + (5 if bank == "bank-b" else 0)
        dense = stats["n"] == stats["distinct"] == (stats["max"] + 1) and stats["n"] == expected
        ok &= dense
        tailer.commit()
        summary.add_row(
            bank, str(stats["n"]), "yes" if dense else "[red]NO[/]", f"{stats['amount']:,.2f}"
        )
    ledger_rows = ledger.read_arrow(partition="main").num_rows
    ok &= ledger_rows == 5
    hidden = (
        postings.read_arrow(partition="bank-b", isolation="read_uncommitted").num_rows
        - sent["bank-b"]
        - 5
    )
    summary.add_row(
        "ledger/main", str(ledger_rows), "yes" if ledger_rows == 5 else "[red]NO[/]", ""
    )
    console.print(summary)
    console.print(f"aborted transaction rows hidden from read_committed readers: {hidden}")
    report = compact(postings)
    checkpoint(postings)
    console.print(f"compaction: {report.files_removed} files -> {report.files_added}")
    after = sum(postings.read_arrow(partition=b, columns=["_offset"]).num_rows for b in BANKS)
    ok &= after == sum(sent.values()) + 5
    verdict = "[bold green]OK[/]" if ok else "[bold red]FAILED[/]"
    console.print(
        f"{verdict}: {sum(sent.values()):,} messages, every offset dense and unique, "
        f"no duplicates, {time.monotonic() - started:.1f}s"
    )
    return ok
