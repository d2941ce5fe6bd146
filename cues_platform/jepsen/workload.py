"""The workload of the Jepsen-style harness: the graph's topology, the keys, and who sends what.

Everything here is a pure function of the seed, so a run can be replayed and the checker can
compute what must be in the lake without asking the platform:

- Keys are strings. Idempotent feeder ``f`` sends ``i{f}-{j:06d}`` in batches; the transactional
  feeder sends transaction ``t`` as keys ``t-{t:05d}-{j:03d}`` and aborts it on purpose when
  :meth:`Plan.aborted` says so (those keys must never be visible read_committed nor processed).
- Partitions: every key queue has the partitions :data:`PARTITIONS` ("0" and "1"). Each batch
  (each transaction) goes to ONE partition, chosen from its number (:func:`idem_partition`,
  :func:`txn_partition`), so :attr:`Plan.partition_of` knows where every key must be, in every
  queue downstream too.
- :func:`is_rejected` is the user function's deterministic rule: a batch holding a rejected key
  raises :class:`Rejected` in processor ``validate`` (so the whole batch is one legitimate error
  row, and its other keys with it).

The graph (``user/jepsen_graph.py``, loaded by ``cues run`` as a user's file)::

    src_a ─┐                                 ┌─> left ──enrich──> enriched
           ├─merge(alts)─> merged ─validate─> validated ─split(fork)─┤
    src_t ─┘                 (raises: errors)                        └─> right ──store(sink)──> sink table

Every processor binds ``In(queue)`` (every partition) and writes ``Out(queue)`` (the same
partition), so it runs as one *lane* per partition (``cues_platform/processing/lanes.py``): the
lane of partition "0" keeps the processor's id (``merge``), the lane of "1" is ``merge.1``. Lane
p reads partition p and writes partition p, so a key stays in the partition it was sent to.
:data:`LANES` lists the ten lanes; the checker derives them from this naming rule, not from the
platform's code.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import cached_property

import pyarrow as pa

# -- topology (shared by the graph file, the feeders and the checker) -------------------------------
SRC_IDEM = "src_a"  # idempotent producers append here (all feeders at once, both partitions)
SRC_TXN = "src_t"  # the transactional producer appends here
TXN_PROGRESS = "txn_progress"  # the transactional feeder's own progress, inside its transactions
MERGED, VALIDATED, LEFT, RIGHT, ENRICHED, ERRORS = (
    "merged", "validated", "left", "right", "enriched", "errors")
SINK_TABLE = "sink_store"  # a plain Delta table under the lake root (write_delta_once)
SINK_LANE_COLUMN = "lane"  # the sink rows' column naming the store lane that applied them
PROCESSORS = ("merge", "validate", "split", "enrich", "store")  # as declared (lane families)
REJECTING_PROCESSOR = "validate"
SINK_PROCESSOR = "store"
REJECTED_EXCEPTION = "Rejected"
PARTITIONS = ("0", "1")  # the partitions of every key queue (one lane per partition)
PROGRESS_PARTITION = "0"  # the one partition of txn_progress and of the error queue
BATCH_SIZE = 300


def lane_id(processor: str, partition: str) -> str:
    """The id of the lane of ``partition`` of ``processor`` (the documented rule: partition "0"
    keeps the processor's id, partition p is ``{processor}.{p}``)."""
    return processor if partition == "0" else f"{processor}.{partition}"


def lane_family(lane: str) -> str:
    """The declared processor whose lane ``lane`` is (``validate.1`` -> ``validate``)."""
    return lane.partition(".")[0]


def lane_partition(lane: str) -> str:
    """The partition lane ``lane`` reads and writes (``validate`` -> "0", ``validate.1`` -> "1")."""
    return lane.partition(".")[2] or "0"


LANES = tuple(lane_id(p, part) for p in PROCESSORS for part in PARTITIONS)


def idem_partition(feeder: int, batch: int) -> str:
    """The partition idempotent feeder ``feeder`` sends its batch ``batch`` to."""
    return PARTITIONS[(feeder + batch) % len(PARTITIONS)]


def txn_partition(txn: int) -> str:
    """The partition of ``src_t`` the transactional feeder sends transaction ``txn`` to."""
    return PARTITIONS[txn % len(PARTITIONS)]

PAYLOAD = pa.schema([pa.field("key", pa.string(), nullable=False),
                     pa.field("n", pa.int64(), nullable=False)])
PROGRESS = pa.schema([pa.field("feeder", pa.string(), nullable=False),
                      pa.field("txn", pa.int64(), nullable=False)])
# Queues whose payload is PAYLOAD, in graph order (the checker reads each of them).
KEY_QUEUES = (SRC_IDEM, SRC_TXN, MERGED, VALIDATED, LEFT, RIGHT, ENRICHED)


class Rejected(ValueError):
    """What the user's function raises for a batch that holds a rejected key."""


def is_rejected(key: str) -> bool:
    """The user's rule: idempotent keys numbered 500, 1500, 2500, ... are rejected (one per
    thousand, so every run with 2,000 keys or more has some) and one transactional key in 2,000."""
    if key.startswith("i"):
        return int(key.rsplit("-", 1)[1]) % 1000 == 500
    digest = hashlib.blake2b(key.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % 2000 == 7


def idem_key(feeder: int, j: int) -> str:
    return f"i{feeder}-{j:06d}"


def txn_key(txn: int, j: int) -> str:
    return f"t-{txn:05d}-{j:03d}"


def key_number(key: str) -> int:
    """A payload integer derived from the key (the functions transform it; nothing checks it)."""
    return int(hashlib.blake2b(key.encode(), digest_size=6).hexdigest(), 16)


def batch_table(keys: list[str]) -> pa.Table:
    return pa.table({"key": pa.array(keys, pa.string()),
                     "n": pa.array([key_number(k) for k in keys], pa.int64())}, schema=PAYLOAD)


@dataclass(frozen=True)
class Plan:
    """What every feeder sends, from the seed: ``keys`` in total, split between ``idem_feeders``
    idempotent feeders and one transactional feeder (about a quarter of the keys)."""

    seed: int
    keys: int = 2_000
    idem_feeders: int = 2
    abort_every: float = 0.25  # share of transactions aborted on purpose

    @cached_property
    def idem_batches(self) -> tuple[tuple[tuple[str, ...], ...], ...]:
        """Per idempotent feeder, its batches of keys (batch b is sent with sequence b)."""
        per = (self.keys * 3 // 4) // self.idem_feeders
        out = []
        for f in range(self.idem_feeders):
            rng = random.Random(f"{self.seed}/idem/{f}")
            batches, j = [], 0
            while j < per:
                size = min(per - j, rng.randint(5, 40))
                batches.append(tuple(idem_key(f, i) for i in range(j, j + size)))
                j += size
            out.append(tuple(batches))
        return tuple(out)

    @cached_property
    def txn_batches(self) -> tuple[tuple[str, ...], ...]:
        """Transaction t's keys (t = 0, 1, ...); committed ones hold about keys/4 keys in all."""
        rng = random.Random(f"{self.seed}/txn")
        target = self.keys - sum(len(b) for bs in self.idem_batches for b in bs)
        batches, committed, t = [], 0, 0
        while committed < target:
            size = rng.randint(5, 30)
            if not self.aborted(t):
                size = min(size, target - committed)
                committed += size
            batches.append(tuple(txn_key(t, j) for j in range(size)))
            t += 1
        return tuple(batches)

    def aborted(self, txn: int) -> bool:
        """True when the feeder aborts transaction ``txn`` on purpose."""
        return random.Random(f"{self.seed}/abort/{txn}").random() < self.abort_every

    @cached_property
    def aborted_keys(self) -> frozenset[str]:
        return frozenset(k for t, b in enumerate(self.txn_batches) if self.aborted(t) for k in b)

    @cached_property
    def partition_of(self) -> dict[str, str]:
        """Every key (aborted ones too) -> the partition its feeder sends it to, which is its
        partition in every queue downstream (lane p reads and writes partition p)."""
        out = {k: idem_partition(f, b) for f, bs in enumerate(self.idem_batches)
               for b, keys in enumerate(bs) for k in keys}
        out.update((k, txn_partition(t)) for t, keys in enumerate(self.txn_batches) for k in keys)
        return out

    @cached_property
    def all_keys(self) -> frozenset[str]:
        """Every key any feeder may make visible (aborted transactions' keys excluded)."""
        keys = {k for bs in self.idem_batches for b in bs for k in b}
        keys.update(k for t, b in enumerate(self.txn_batches) if not self.aborted(t) for k in b)
        return frozenset(keys)


# -- feeders' durable progress (one append-only log file per feeder) ---------------------------------
def ack_log_name(feeder: str) -> str:
    return f"acked-{feeder}.log"


def read_acked(path) -> list[int]:
    """Batch (or transaction) numbers a feeder logged as acknowledged. A line without its newline
    was cut by a kill: it does not count."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    lines = text.split("\n")
    return [int(line) for line in lines[:-1] if line.strip()]


def acked_keys(plan: Plan, run_dir) -> set[str]:
    """Keys whose send (or transaction commit) returned, from every feeder's ack log."""
    from pathlib import Path

    run_dir = Path(run_dir)
    keys: set[str] = set()
    for f, batches in enumerate(plan.idem_batches):
        for b in read_acked(run_dir / ack_log_name(f"idem{f}")):
            keys.update(batches[b])
    for t in read_acked(run_dir / ack_log_name("txn")):
        keys.update(plan.txn_batches[t])
    return keys
