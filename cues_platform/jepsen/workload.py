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
  raises :class:`Rejected` in processor ``validate``; the step isolates the rejected key
  (``processing/isolation.py``): one legitimate error row per rejected key, the rest of its batch
  delivered.

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


def ranges_log_name(feeder: str) -> str:
    """Where a feeder logs the offsets of each acknowledged batch (JSON lines)."""
    return f"ranges-{feeder}.jsonl"


def acked_offsets(plan: Plan, run_dir) -> dict[str, tuple[str, str, int]]:
    """Acknowledged key -> (input queue, partition, offset), from the feeders' ranges logs (a
    batch's keys are at ``first``, ``first + 1``, ... in plan order). A key whose range was not
    logged (the transactional feeder killed between commit and log) is absent."""
    import json
    from pathlib import Path

    out: dict[str, tuple[str, str, int]] = {}
    logs = [(f"idem{f}", SRC_IDEM, batches) for f, batches in enumerate(plan.idem_batches)]
    logs.append(("txn", SRC_TXN, plan.txn_batches))
    for feeder, queue, batches in logs:
        try:
            text = (Path(run_dir) / ranges_log_name(feeder)).read_text()
        except FileNotFoundError:
            continue
        for line in text.split("\n")[:-1]:
            if not line.strip():
                continue
            rec = json.loads(line)
            for part, (first, _end) in rec["ranges"].items():
                for i, key in enumerate(batches[rec["batch"]]):
                    out[key] = (queue, part, first + i)
    return out


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


# -- graph variants (the redeploy nemesis) ---------------------------------------------------------
# The nemesis redeploys the graph between runner restarts: ``cues run jepsen_graph.py:<attr>`` of
# one of these variants. Compatible ones must be continued exactly once (every key still flows to
# the queues the checker reads); incompatible ones must be refused before any step with the
# RedeployError subclass named here (processing/deployments.py), once the processor they change
# has made progress (before that, a change has nothing to contradict, so it is not attempted).
BASE = "base"
SPARE = "spare"  # the extra input of variant "extra_input" (nobody writes it)
ENRICHED_V2 = "enriched_v2"  # the home of variant "home_enrich" (must stay empty)
REDEPLOY_TARGETS = ("validate", "split", "enrich")  # the declared processors incompatible variants change
FIRST_OUTPUT = {"validate": VALIDATED, "split": LEFT, "enrich": ENRICHED}  # each target's home queue
RENAMED_SUFFIX = "_v2"  # variant rename_{p} declares processor p as f"{p}_v2"


@dataclass(frozen=True)
class Variant:
    """One version of the graph. ``refusal``: None for a compatible variant, else the class name
    of the RedeployError a start must fail with once ``target`` made progress: its first output
    (:data:`FIRST_OUTPUT`) has rows in partition ``needs_partition`` (None: in any partition)."""

    name: str
    refusal: str | None = None
    target: str | None = None
    needs_partition: str | None = None
    what: str = ""

    @property
    def compatible(self) -> bool:
        return self.refusal is None

    @property
    def attr(self) -> str:
        """The attribute of ``user/jepsen_graph.py`` that holds this variant's graph."""
        return "graph" if self.name == BASE else f"graph_{self.name}"

    @property
    def graph_name(self) -> str:
        """The graph's name (the registry ``_cues/deployments`` records it with every shape)."""
        return "jepsen" if self.name == BASE else f"jepsen-{self.name}"


def _variants() -> dict[str, Variant]:
    out = [Variant(BASE, what="every processor In(queue) over both partitions"),
           Variant("renamed", what="every input binding renamed (merge: idem/txn, the others: rows)"),
           Variant("extra_input", what=f"merge reads a third input, queue {SPARE!r} (empty)"),
           Variant("batch", what="batch size 97 instead of 300")]
    for p in REDEPLOY_TARGETS:
        out += [Variant(f"named_{p}", "LaneMigrationError", p, PARTITIONS[1],
                        f"{p} reads only partition {PARTITIONS[1]!r} by name (lane {p}.1's input "
                        f"under the id {p})"),
                Variant(f"strategy_{p}", "StrategyChangedError", p, None, f"{p} at_least_once"),
                Variant(f"rename_{p}", "ProcessorRenamedError", p, None,
                        f"{p} declared as {p}{RENAMED_SUFFIX}")]
    out.append(Variant("home_enrich", "HomeChangedError", "enrich", None,
                       f"enrich writes {ENRICHED_V2!r} instead of {ENRICHED!r}"))
    return {v.name: v for v in out}


VARIANTS = _variants()
COMPATIBLE = tuple(v for v in VARIANTS.values() if v.compatible)
INCOMPATIBLE = tuple(v for v in VARIANTS.values() if not v.compatible)
REDEPLOY_LOG = "redeploys.jsonl"  # the nemesis's record of every redeploy (the checker reads it)


def read_redeploys(run_dir) -> list[dict]:
    """The redeploy records of a run (one JSON object a line; a line cut by a kill is ignored)."""
    import json
    from pathlib import Path

    try:
        text = (Path(run_dir) / REDEPLOY_LOG).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def bindings_of(variant: str) -> dict[str, tuple[str, ...]]:
    """Each declared processor's input binding names under ``variant`` (sorted)."""
    merge = ("idem", "txn") if variant == "renamed" else ("a", "t")
    if variant == "extra_input":
        merge = ("a", "spare", "t")
    src = ("rows",) if variant == "renamed" else ("src",)
    out = {"merge": merge} | {p: src for p in PROCESSORS if p != "merge"}
    v = VARIANTS[variant]
    if variant.startswith("rename_"):
        out[v.target + RENAMED_SUFFIX] = out.pop(v.target)  # type: ignore[operator]
    return out


# -- the time nemesis (``--time``; cues_platform/jepsen/timewarp.py) ---------------------------------
EPHEMERAL = "ephemeral"  # short-lived producers append here (one new producer id a platform day)
MONTHLY = "monthly"  # the lane family that steps once a platform month (user graph ``monthly``)
MONTHLY_OUT = "monthly_out"  # its output (every key of ``enriched`` once)
MONTHLY_GRAPH = "jepsen-monthly"
MONTHLY_BATCH = 40  # small steps: each monthly burst takes several, so step time is sampled
MONTHLY_LANES = tuple(lane_id(MONTHLY, part) for part in PARTITIONS)
DEAD_PARTITION = PARTITIONS[0]  # where the dead transactions send (src_t)
DEAD_KEYS = 5
TIME_LOG = "time.jsonl"  # the time nemesis's records (clock samples, footprints, reads, dead txns)
LAGGING_LOG = "lagging-merged.jsonl"  # every (partition, offset, key) the lagging tailer read of merged


def read_lagging(run_dir) -> list[tuple[str, int, str]]:
    """(partition, offset, key) of every row of ``merged`` the lagging tailer read (a
    non-expendable reader, so retention never removed a row before it read it); a row read
    twice (a read repeated after a failed commit) is there twice."""
    import json
    from pathlib import Path

    try:
        text = (Path(run_dir) / LAGGING_LOG).read_text()
    except FileNotFoundError:
        return []
    return [(p, int(o), k) for p, o, k in (json.loads(line) for line in text.split("\n")[:-1] if line.strip())]


def dead_key(index: int, j: int) -> str:
    """Key j of dead transaction ``index`` (never visible: its producer is killed before commit)."""
    return f"d-{index:02d}-{j:03d}"


def read_time_log(run_dir) -> list[dict]:
    """The time nemesis's records (one JSON object a line; a line cut by a kill is ignored)."""
    import json
    from pathlib import Path

    try:
        text = (Path(run_dir) / TIME_LOG).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]
