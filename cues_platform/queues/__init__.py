"""Queues: append-only Delta tables with dense offsets, producers, tailers and maintenance."""

from cues_platform.queues.appender import AppendResult
from cues_platform.queues.coordinator import TxnStatus
from cues_platform.queues.errors import (
    BatchError,
    ConcurrentAppendError,
    InvalidArgumentError,
    InvalidNameError,
    InvalidRangeError,
    NullValueError,
    OffsetOutOfRangeError,
    OffsetRangeError,
    PendingSendError,
    ProducerFencedError,
    QueueError,
    QueueExistsError,
    QueueNotFoundError,
    ReadTimeoutError,
    ReservedColumnError,
    SchemaError,
    SequenceError,
    SequenceMismatchError,
    StorageUnreachableError,
    TransactionStateError,
    UnknownPartitionError,
    UnknownProducerIdError,
    UnknownTransactionError,
)
from cues_platform.queues.lake import Lake
from cues_platform.queues.layout import OffsetLayout
from cues_platform.queues.producer import Acks, AsyncProducer, Producer
from cues_platform.queues.queue import Queue
from cues_platform.queues.reader import Isolation, read_arrow, read_spark
from cues_platform.queues.tailer import Tailer
from cues_platform.queues.transactions import TransactionalProducer

__all__ = [
    "Acks",
    "AppendResult",
    "OffsetLayout",
    "AsyncProducer",
    "BatchError",
    "ConcurrentAppendError",
    "InvalidArgumentError",
    "InvalidNameError",
    "InvalidRangeError",
    "Isolation",
    "Lake",
    "NullValueError",
    "OffsetOutOfRangeError",
    "OffsetRangeError",
    "PendingSendError",
    "Producer",
    "ProducerFencedError",
    "Queue",
    "QueueError",
    "QueueExistsError",
    "QueueNotFoundError",
    "ReadTimeoutError",
    "ReservedColumnError",
    "SchemaError",
    "SequenceError",
    "SequenceMismatchError",
    "UnknownProducerIdError",
    "StorageUnreachableError",
    "Tailer",
    "TransactionStateError",
    "TransactionalProducer",
    "TxnStatus",
    "UnknownPartitionError",
    "UnknownTransactionError",
    "read_arrow",
    "read_spark",
]
