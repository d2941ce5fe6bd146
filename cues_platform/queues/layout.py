"""The layout of the platform's Delta tables: table properties and every app-transaction id.

The bottom floor of ``queues/``: data, no behaviour. Every module that writes or reads one of these
names takes it from here, so the protocol's persistent state has one owner and one list.

An app transaction (Delta's ``txn`` action, ``app_id = version``) is the platform's durable state:
offsets, producer sequences, fences, positions, transaction decisions. Each is written in the same
commit as the data it describes, so it holds exactly when that data does. :data:`APP_IDS` is the
registry: for each id its table, the meaning of its version, the module that writes it and what
makes it go away. ``python -m cues_platform.devtools.pages --write`` prints it as
docs/app-transactions.md (a test keeps that page equal to this registry).

Only ids written with ``lastUpdated`` can expire (Delta's ``delta.setTransactionRetentionDuration``,
judged by delta-rs with the real clock of the process loading a snapshot): :func:`expires` says
which. Every other id lives as long as its table.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from deltalake import PostCommitHookProperties

from cues_platform.queues.schema import APPEND_TIME, OFFSET, TXN_ID

# -- table properties ---------------------------------------------------------------------------
PARTITIONS_KEY = "cues.partitions"  # the queue's declared partitions (JSON list)
MAX_ROWS_KEY = "cues.maxBatchRows"  # the largest batch one append may hold
FORMAT_KEY = "cues.format"  # the queue layout's version: "1" absolute offsets, "2" based


class OffsetLayout(StrEnum):
    """How a queue's data files hold their rows' offsets (chosen when the queue is created).

    ``absolute`` (format "1", the default): each row's ``_offset`` is its offset; the table is
    partitioned by ``_partition``. ``based`` (format "2"): the table has a second partition column
    ``_base`` and a row's offset is ``_base + _offset``. Files the driver writes have ``_base = 0``
    (absolute offsets); files Spark's executors write in ONE job hold each row's index in its file
    and get their base when the step commits (``queues/based.py``), so a large step runs its plan
    once and no row crosses the driver. Every reader of the platform returns absolute offsets
    either way; another Delta reader sees ``_base`` beside ``_offset`` and must add them."""

    ABSOLUTE = "absolute"
    BASED = "based"

    @property
    def format_version(self) -> str:
        return "2" if self is OffsetLayout.BASED else "1"

RETENTION_MS_KEY = "cues.retention.ms"  # retention by age (queues/retention.py); -1 = keep
RETENTION_BYTES_KEY = "cues.retention.bytes"  # retention by size; -1 = keep
# File statistics only where the queue layer prunes by them (delta.dataSkippingStatsColumns):
# computing min/max of every payload column took a third of a small append's commit.
STATS_COLUMNS = f"{OFFSET},{TXN_ID},{APPEND_TIME}"
TXN_RETENTION_KEY = "delta.setTransactionRetentionDuration"  # when expiring app ids may go

# -- commit metadata the log check reads (queues/integrity.py) ----------------------------------
RANGES_KEY = "cues.ranges"  # an append: {partition: [first, end)} of the rows it adds
# a retention delete (retention.py): {partition: [old start, new start]}; its adds are the rows
# of files it rewrote, which keep their offsets
RETENTION_KEY = "cues.retention"

# The post-commit hooks of every commit the platform makes: checkpoints as delta-rs makes them
# (every ``delta.checkpointInterval`` commits), but no expired-log cleanup. delta-rs' default
# cleanup lists the whole ``_delta_log`` folder after every commit, which on a local disk costs
# O(log files): 135 ms per commit once a queue has 10,000 commits (bench/bench_peers.py's
# recovery case), growing for the whole ``delta.logRetentionDuration``. Expired log files are
# removed by ``maintenance.checkpoint`` (``cues queue maintain``) and, for a processor's home
# queue, by the stepper right after it digested the steps those files hold (processing/step.py).
COMMIT_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
# A commit that must not be checkpointed by delta-rs' hook: maintenance's empty commit, whose
# version gets a checkpoint without the redundant tombstones instead (maintenance.py)
NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
# Set on every queue the platform creates, so that any other Delta writer skips the cleanup too.
NO_LOG_CLEANUP_PROPERTY = {"delta.enableExpiredLogCleanup": "false"}
# Every queue the platform creates is checkpointed every this many commits (Delta's own default;
# delta-rs' is 100). delta-rs 1.6 replays the log from the newest checkpoint on EVERY refresh
# (``update_incremental``) and every ``transaction_version`` lookup, even one version ahead, and
# every process polling a queue pays that on each look; a checkpoint costs only the writer whose
# commit reaches the interval (bench/results/checkpoint_interval.json; the postings network's p99,
# participants-4.json to -7.json). A queue's own ``properties={"delta.checkpointInterval": ...}``
# overrides it; queues created before keep the interval they were created with.
QUEUE_CHECKPOINT_INTERVAL = 10

DEFAULT_VACUUM_RETENTION_HOURS = 24
# How long a queue's log and checkpoints keep the tombstones (remove actions) of compacted files:
# exactly the vacuum retention. Measured on delta-rs 1.6 (tests/queues/test_tombstones.py): a
# checkpoint drops every tombstone older than ``delta.deletedFileRetentionDuration``; after that a
# full vacuum (the platform's) judges the file by its modification time alone, so it is deleted
# (never leaked) once older than the vacuum retention, but a file written long ago and compacted
# away recently goes at once, under a reader that opened its snapshot within the retention. A
# tombstone retention at least the vacuum's keeps that reader's files; a longer one protects
# nothing more and costs every open of the queue a tombstone per compacted file (Delta's default,
# a week, left 10,000 in a 10,000-step home queue's checkpoint). A vacuum with a retention longer
# than this one does not protect readers for its whole retention (see docs/benchmarks.md,
# "Tombstones and recovery").
QUEUE_TOMBSTONE_RETENTION = f"interval {DEFAULT_VACUUM_RETENTION_HOURS} hours"
QUEUE_TOMBSTONE_PROPERTY = {"delta.deletedFileRetentionDuration": QUEUE_TOMBSTONE_RETENTION}


# -- app-transaction ids ------------------------------------------------------------------------
@dataclass(frozen=True)
class AppId:
    """One kind of app-transaction id: ``prefix`` + the key's parts joined as ``key`` shows."""

    prefix: str
    key: str  # the shape of what follows the prefix, e.g. "{partition}"
    table: str  # the table it lives in
    version: str  # what the version means
    owner: str  # the module that writes it
    expiry: str  # what makes it go away
    expiring: bool = False  # written with lastUpdated: Delta may forget it

    def id(self, *parts: str) -> str:
        """The app id for ``parts``, in the order ``key`` names them."""
        names = self.key.count("{")
        if len(parts) != names:
            raise TypeError(f"app id {self.prefix}{self.key} takes {names} part(s), got {parts!r}")
        text = self.key
        for part in parts:
            start = text.index("{")
            text = text[:start] + str(part) + text[text.index("}", start) + 1:]
        return self.prefix + text


_NEVER = "never: lives as long as its table"
QUEUE, COORDINATOR, POSITIONS = "queue", "_cues/transactions", "_cues/positions"
HOME, BACKING, SINK_TABLE = "processor home (output) queue", "_cues/backing/{processor}", \
    "sink Delta table"

PARTITION = AppId("part:", "{partition}", QUEUE, "next offset of the partition (rows [0, v) exist)",
                  "queues/appender.py (every append), queues/by_reference.py", _NEVER)
START = AppId("start:", "{partition}", QUEUE,
              "start offset: rows below it were removed by retention (absent = 0)",
              "queues/retention.py (delete_below)", _NEVER + "; only ever moves forward")
PRODUCER = AppId("prod:", "{producer id}", QUEUE,
                 "last sequence number an idempotent producer committed",
                 "queues/idempotence.py", f"expires when idle longer than {TXN_RETENTION_KEY} "
                 "(the producer then gets UnknownProducerIdError and opens a new epoch)",
                 expiring=True)
PRODUCER_EPOCH = AppId("pepoch:", "{producer id}", QUEUE,
                       "the producer id's newest epoch (fences older instances)",
                       "queues/idempotence.py", f"expires with {TXN_RETENTION_KEY}", expiring=True)
TXN_MARKER = AppId("txn:", "{txn id}", QUEUE,
                   "the transaction's decision rolled forward: 0 open, 1 committed, 2 aborted",
                   "queues/coordinator.py (write_marker)",
                   f"expires with {TXN_RETENTION_KEY}; readers then ask the coordinator",
                   expiring=True)
TXN_STATUS = AppId("txn:", "{txn id}", COORDINATOR,
                   "the transaction's decision: 0 open, 1 committed, 2 aborted",
                   "queues/coordinator.py", _NEVER + " (the decision of record)")
TRANSACTIONAL_EPOCH = AppId("tid:", "{transactional id}", COORDINATOR,
                            "the transactional id's epoch (init_transactions fences the older)",
                            "queues/coordinator.py, queues/transactions.py", _NEVER)
CURRENT_TXN = AppId("cur:", "{transactional id}", COORDINATOR,
                    "number of the transactional id's newest transaction",
                    "queues/transactions.py", _NEVER)
DEADLINE = AppId("dl:", "{txn id}", COORDINATOR,
                 "the transaction's deadline, ms on the platform clock (clock.py)",
                 "queues/transactions.py (begin)", _NEVER)
ABORT_REASON = AppId("why:", "{txn id}", COORDINATOR,
                     "why someone other than the owner aborted it: 1 timeout, 2 operator",
                     "queues/coordinator.py (decide_abort)", _NEVER)
TAILER_POSITION = AppId("pos:", "{queue}/{tailer}/{partition}", POSITIONS,
                        "the tailer's next offset to read", "queues/positions.py",
                        _NEVER + "; a tailer is forgotten by deleting its position")
TAILER_EXPENDABLE = AppId("exp:", "{queue}/{tailer}/{partition}", POSITIONS,
                          "1 if retention may pass the tailer (expendable=True), else 0",
                          "queues/positions.py", _NEVER)
PROCESSOR_STEP = AppId("proc:", "{processor}", HOME,
                       "the last step the processor committed to this output queue",
                       "processing/outputs.py", _NEVER)
PROCESSOR_EPOCH = AppId("epoch:", "{processor}", HOME,
                        "the processor runner's epoch (fences an older runner)",
                        "processing/home.py", _NEVER)
# queue names hold no '/' or ':' and binding names are Python identifiers (never a '/'), so no
# two (queue, partition) pairs share a lane position id and no legacy id is one
LANE_POSITION = AppId("pos:", "{processor}:{queue}/{partition}", HOME,
                      "the processor's next offset on one input lane",
                      "processing/home.py (in the step's commit)", _NEVER)
LEGACY_LANE_POSITION = AppId("pos:", "{processor}:{binding}", HOME,
                             "position of lakes written before lanes were keyed by queue and "
                             "partition (read, never written now)", "processing/home.py", _NEVER)
BACKING_EPOCH = AppId("epoch", "", BACKING, "the backing queue's runner epoch (fencing)",
                      "processing/backing.py", _NEVER)
SINK_STEP = AppId("sink:", "{processor}", SINK_TABLE,
                  "the last step a sink applied to this table (write_delta_once)",
                  "processing/sinks.py", _NEVER)

APP_IDS: tuple[AppId, ...] = (
    PARTITION, START, PRODUCER, PRODUCER_EPOCH, TXN_MARKER, TXN_STATUS, TRANSACTIONAL_EPOCH,
    CURRENT_TXN, DEADLINE, ABORT_REASON, TAILER_POSITION, TAILER_EXPENDABLE, PROCESSOR_STEP,
    PROCESSOR_EPOCH, LANE_POSITION, LEGACY_LANE_POSITION, BACKING_EPOCH, SINK_STEP,
)
# app ids that may expire (written with lastUpdated); everything else never does. "txn:" expires
# only as a queue's marker: the coordinator writes its decisions without lastUpdated.
EXPIRING_PREFIXES = tuple(dict.fromkeys(a.prefix for a in APP_IDS if a.expiring))


def expires(app_id: str) -> bool:
    """Whether ``app_id`` is written with ``lastUpdated`` (may be expired by Delta's retention)."""
    return app_id.startswith(EXPIRING_PREFIXES)
