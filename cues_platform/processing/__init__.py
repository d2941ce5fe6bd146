"""Processors, graphs and the delivery strategies (exactly-once by default)."""

from cues_platform.processing.backing import BackingQueue, Range, Record, RecordType, Snapshot
from cues_platform.processing.context import StepContext
from cues_platform.processing.decorators import processor_asset
from cues_platform.processing.errors import (
    GraphError,
    ProcessingError,
    ProcessorFencedError,
    RecoveryError,
    SimulatedCrash,
    UnhandledStepError,
)
from cues_platform.processing.graph import (
    AssetBody,
    Graph,
    In,
    Kind,
    Options,
    Out,
    OutputWriter,
    Processor,
    QueueDef,
    ReadAs,
    SnapshotAt,
    Strategy,
)
from cues_platform.processing.model import OnError
from cues_platform.processing.outputs import ERROR_SCHEMA
from cues_platform.processing.runner import GraphRunner, ProcessorStats
from cues_platform.processing.step import ExactlyOnceStepper, StepResult

__all__ = [
    "ERROR_SCHEMA", "AssetBody", "BackingQueue", "ExactlyOnceStepper", "Graph", "GraphError", "GraphRunner", "In",
    "Kind", "Options", "Out", "ProcessingError", "Processor", "ProcessorFencedError", "ProcessorStats",
    "QueueDef", "Range", "Record", "RecordType", "RecoveryError", "SimulatedCrash", "Snapshot",
    "OnError", "OutputWriter",
    "ReadAs", "SnapshotAt",
    "StepContext", "StepResult", "Strategy", "UnhandledStepError", "processor_asset",
]
