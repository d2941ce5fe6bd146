"""Delivery pipes: reliable and ordered delivery between workers over faulty routes.

Six pipes from the pipes directory seed, all driven by a logical clock:

=================================  ==============================================================
pipe                               delivery contract
=================================  ==============================================================
:class:`ResendPipe`                at-least-once (one unconfirmed message, a buffer behind it)
:class:`ResendMultiPipe`           at-least-once (many unconfirmed messages)
:class:`StreamPipe`                at-least-once through persistent storage
:class:`SequentialConfirmPipe`     continuously ordered over at-least-once routes
:class:`StrictIndexPipe`           strictly monotonic (``Check.RELAXED``: monotonic)
:class:`ContinuousIndexPipe`       absolutely ordered over an at-least-once route
                                   (``Check.RELAXED``: continuously ordered)
=================================  ==============================================================

See ``docs/pipes.md`` for the property table with links to the tests that prove each cell.
"""

from __future__ import annotations

from .compose import exactly_once_pipe, fifo, sequential_over_resend
from .errors import (
    CodecError,
    ConfigError,
    PipeError,
    RouteError,
    SimulationTimeout,
    StorageError,
    WorkerDownError,
)
from .index import Check, ContinuousIndexPipe, StrictIndexPipe
from .properties import Property, check
from .resend import ResendConfig, ResendMultiPipe, ResendPipe
from .routes import LOSSLESS, FaultSchedule, FaultyLink, Link, Ordering, Route, memory_route
from .sequential import SequentialConfirmPipe
from .sim import Clock, Simulation
from .storage import IndexStore, MemoryIndexStore, MemoryStreamStore, StreamStore
from .stream import StreamConfig, StreamPipe
from .workers import Outbox, Pipe, Status, Worker

__all__ = [
    "LOSSLESS",
    "Check",
    "Clock",
    "CodecError",
    "ConfigError",
    "ContinuousIndexPipe",
    "FaultSchedule",
    "FaultyLink",
    "IndexStore",
    "Link",
    "MemoryIndexStore",
    "MemoryStreamStore",
    "Ordering",
    "Outbox",
    "Pipe",
    "PipeError",
    "Property",
    "ResendConfig",
    "ResendMultiPipe",
    "ResendPipe",
    "Route",
    "RouteError",
    "SequentialConfirmPipe",
    "Simulation",
    "SimulationTimeout",
    "Status",
    "StorageError",
    "StrictIndexPipe",
    "StreamConfig",
    "StreamPipe",
    "StreamStore",
    "Worker",
    "WorkerDownError",
    "check",
    "exactly_once_pipe",
    "fifo",
    "memory_route",
    "sequential_over_resend",
]
