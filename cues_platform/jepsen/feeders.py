"""Feeder processes: what a producing application does, killed at random by the nemesis.

Each feeder resumes from its own durable progress, so every key is eventually sent and
acknowledged whatever the kills:

- ``idem``: an idempotent producer sends batch ``b`` of its plan with sequence ``b`` to partition
  :func:`~cues_platform.jepsen.workload.idem_partition` (feeder + b) % 2 of ``src_a`` (one
  sequence per producer and queue, over both partitions) and logs ``b`` in its ack log once
  ``send`` returned (a key is acknowledged only then). After a kill it resends
  the first batch not logged, with the same sequence: if that batch had landed, the resend must be
  recognised (``duplicate=True``, the same offsets). Injected lost acknowledgements: for some
  batches the commit lands and then the caller either gets no answer (it resends the same batch
  with the same sequence at once) or is killed (SIGKILL of itself; the next start resends).
- ``txn``: a transactional producer sends transaction ``t`` (its keys to partition t % 2 of
  ``src_t``, plus a progress row to ``txn_progress``'s one partition, in the same transaction)
  and commits it, or aborts it on purpose when the plan says so. After a kill,
  ``init_transactions`` aborts what was open; the committed progress rows (read_committed) say
  which transactions landed, so none is committed twice.

Anything a feeder sees that breaks the producer's promise (a resend not recognised, other
offsets) is written to ``anomalies.log`` in the run folder and reported by the harness.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import click

from cues_platform.clock import now_ms
from cues_platform.jepsen import workload as w
from cues_platform.queues import Lake, TransactionalProducer
from cues_platform.queues.errors import SequenceError, UnknownProducerIdError

LOST_ACK_LOG = "lost-acks.log"
ANOMALIES_LOG = "anomalies.log"
UNVERIFIED_LOG = "unverified-resends.log"  # resends the queue could no longer verify (log cleaned up)


def _append_line(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())


def run_idem(*, lake: Lake, run_dir: Path, plan: w.Plan, index: int, lost_ack_rate: float,
             pace: float) -> None:
    name = f"idem{index}"
    batches = plan.idem_batches[index]
    log = run_dir / w.ack_log_name(name)
    lost_log = run_dir / LOST_ACK_LOG
    already_lost = {line for line in (lost_log.read_text().splitlines() if lost_log.exists() else [])}
    done = w.read_acked(log)
    producer = lake.queue(w.SRC_IDEM).producer(producer_id=f"jepsen-{name}")
    for b in range(max(done, default=-1) + 1, len(batches)):
        data, part = w.batch_table(list(batches[b])), w.idem_partition(index, b)
        try:
            result = producer.send(data, partition=part, sequence=b)
        except SequenceError as exc:
            if isinstance(exc, UnknownProducerIdError) or getattr(exc, "expected", 0) <= b:
                raise
            # A resend of batch b after the log that held its commit's digest was cleaned up (the
            # feeder was down longer than delta.logRetentionDuration of the platform clock): the
            # queue refuses to acknowledge it unverified and says sequence b is committed. This
            # producer id is the feeder's alone and sends batch b only as sequence b, so the commit
            # is its batch b: it counts as acknowledged, at offsets it never learnt (the checker
            # finds such keys in the queue or downstream).
            _append_line(run_dir / UNVERIFIED_LOG, json.dumps({"feeder": name, "batch": b,
                                                              "expected": exc.expected}))
            _append_line(log, str(b))
            continue
        rng = random.Random(f"{plan.seed}/lost/{name}/{b}")
        if rng.random() < lost_ack_rate and f"{name}:{b}" not in already_lost:
            _append_line(lost_log, f"{name}:{b}")
            if rng.random() < 0.5:
                os.kill(os.getpid(), signal.SIGKILL)  # the ack is lost with the caller
            again = producer.send(data, partition=part, sequence=b)  # no answer: resend
            if not again.duplicate or dict(again.ranges) != dict(result.ranges):
                _append_line(run_dir / ANOMALIES_LOG, json.dumps({
                    "feeder": name, "batch": b, "first": {p: list(r) for p, r in result.ranges.items()},
                    "resend": {p: list(r) for p, r in again.ranges.items()},
                    "duplicate": again.duplicate}))
        _log_ranges(run_dir, name, b, result.ranges)
        _append_line(log, str(b))
        time.sleep(pace)


def _log_ranges(run_dir: Path, feeder: str, batch: int, ranges) -> None:
    """Where an acknowledged batch landed (``{partition: [first, end)}``, from the send's
    ``AppendResult``), logged before its ack line: the checker tells an acknowledged key that
    retention removed (below the partition's start offset) from one that is lost (at or above)."""
    _append_line(run_dir / w.ranges_log_name(feeder), json.dumps(
        {"batch": batch, "ranges": {p: [int(a), int(b)] for p, (a, b) in dict(ranges).items()}}))


class LostAckError(Exception):
    """Injected by the txn feeder: a send committed and its caller never heard back."""


def committed_txns(lake: Lake) -> set[int]:
    """Transactions whose progress row is visible read_committed (the feeder's own bookkeeping)."""
    table = lake.queue(w.TXN_PROGRESS).read_arrow(partition=w.PROGRESS_PARTITION)
    return {int(t) for t in table["txn"].to_pylist()}


def run_txn(*, lake: Lake, run_dir: Path, plan: w.Plan, pace: float, resend_in_txn: bool,
            timeout: float | None = None) -> None:
    log = run_dir / w.ack_log_name("txn")
    armed = {"lose_ack": False}

    def hook(step: str) -> None:
        if step == "sent" and armed["lose_ack"]:
            armed["lose_ack"] = False
            raise LostAckError("the send committed; its acknowledgement is lost")

    extra = {} if timeout is None else {"timeout": timeout}
    txp = TransactionalProducer(lake, transactional_id="jepsen-txn", hook=hook, **extra)
    txp.init_transactions()  # fences a killed instance and aborts what it left open
    committed = committed_txns(lake)
    logged = set(w.read_acked(log))
    for t in sorted(committed - logged):  # committed, but the kill came before the log line
        _append_line(log, str(t))
    src, progress = lake.queue(w.SRC_TXN), lake.queue(w.TXN_PROGRESS)
    for t in range(max(committed, default=-1) + 1, len(plan.txn_batches)):
        data, part = w.batch_table(list(plan.txn_batches[t])), w.txn_partition(t)
        txp.begin()
        if resend_in_txn and random.Random(f"{plan.seed}/txnresend/{t}").random() < 0.3:
            # A lost acknowledgement inside a transaction: the send's commit lands, then the call
            # fails; the caller resends the same batch, which must be recognised (written once).
            armed["lose_ack"] = True
            try:
                first = txp.send(src, data, partition=part)
            except LostAckError:
                again = sent = txp.send(src, data, partition=part)
                if not again.duplicate:
                    _append_line(run_dir / ANOMALIES_LOG, json.dumps({
                        "feeder": "txn", "txn": t, "resend": {p: list(r) for p, r in again.ranges.items()},
                        "duplicate": again.duplicate}))
            else:
                raise RuntimeError(f"txn {t}: the injected lost acknowledgement did not fire ({first})")
        else:
            sent = txp.send(src, data, partition=part)
        txp.send(progress, {"feeder": ["txn"], "txn": [t]}, partition=w.PROGRESS_PARTITION)
        if plan.aborted(t):
            txp.abort()
        else:
            txp.commit()
            _log_ranges(run_dir, "txn", t, sent.ranges)
            _append_line(log, str(t))
        time.sleep(pace)


def run_dead(*, lake: Lake, run_dir: Path, index: int, timeout: float) -> None:
    """The time nemesis's dead producer: open a transaction, send ``DEAD_KEYS`` keys to
    ``src_t``, record where they are and the deadline, then wait to be SIGKILLed (it never comes
    back: nobody re-inits its transactional id, so only the timeout can end the transaction)."""
    txp = TransactionalProducer(lake, transactional_id=f"jepsen-dead-{index}", timeout=timeout)
    txp.init_transactions()
    began = now_ms()
    txn = txp.begin()
    keys = [w.dead_key(index, j) for j in range(w.DEAD_KEYS)]
    result = txp.send(lake.queue(w.SRC_TXN), w.batch_table(keys), partition=w.DEAD_PARTITION)
    first, end = result.ranges[w.DEAD_PARTITION]
    record = {"event": "dead_txn", "index": index, "txn": txn, "first": int(first), "end": int(end),
              "began_ms": began, "sent_ms": now_ms(), "timeout_ms": txp.timeout_ms, "keys": keys}
    tmp = run_dir / f".dead-{index}.json.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, run_dir / f"dead-{index}.json")
    while True:  # the nemesis kills this process; it never commits
        time.sleep(3600)


@click.command()
@click.argument("kind", type=click.Choice(["idem", "txn", "dead"]))
@click.option("--lake", "lake_root", required=True)
@click.option("--run-dir", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", type=int, required=True)
@click.option("--keys", type=int, required=True)
@click.option("--index", type=int, default=0)
@click.option("--lost-ack-rate", type=float, default=0.0)
@click.option("--pace", type=float, default=0.0, help="Seconds between batches.")
@click.option("--resend-in-txn", is_flag=True)
@click.option("--txn-timeout", type=float, default=None,
              help="Transaction timeout in seconds of the platform clock (default: the producer's).")
def main(kind: str, lake_root: str, run_dir: Path, seed: int, keys: int, index: int,
         lost_ack_rate: float, pace: float, resend_in_txn: bool, txn_timeout: float | None) -> None:
    """One feeder process (started and killed by the harness)."""
    lake, plan = Lake(root=lake_root), w.Plan(seed=seed, keys=keys)
    if kind == "dead":
        run_dead(lake=lake, run_dir=run_dir, index=index, timeout=txn_timeout or 60.0)
    elif kind == "idem":
        run_idem(lake=lake, run_dir=run_dir, plan=plan, index=index, lost_ack_rate=lost_ack_rate,
                 pace=pace)
    else:
        run_txn(lake=lake, run_dir=run_dir, plan=plan, pace=pace, resend_in_txn=resend_in_txn,
                timeout=txn_timeout)
    print(f"feeder {kind}{index if kind == 'idem' else ''}: done", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
