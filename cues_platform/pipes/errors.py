"""Typed exceptions raised by the delivery pipes.

Every error raised on purpose by :mod:`cues_platform.pipes` derives from :class:`PipeError`, so
callers can catch the whole family with one ``except PipeError`` (and every error of the package
with ``except CuesError``).
"""

from __future__ import annotations

from cues_platform.errors import CuesError


class PipeError(CuesError):
    """Root of all pipe errors (a :class:`cues_platform.errors.CuesError`, like every error of
    the package)."""


class ConfigError(PipeError, ValueError):
    """A pipe, route or fault schedule was configured with invalid values."""


class WorkerDownError(PipeError):
    """An operation was attempted on a worker that has crashed and not restarted."""

    def __init__(self, worker: str) -> None:
        super().__init__(f"worker {worker!r} is down")
        self.worker = worker


class RouteError(PipeError):
    """A route could not carry a message (e.g. a loopback endpoint without a peer)."""


class CodecError(PipeError):
    """A message could not be encoded to or decoded from its wire format."""


class StorageError(PipeError):
    """A stream or index storage operation failed."""


class SimulationTimeout(PipeError):
    """A simulation did not reach the awaited condition within its tick budget."""

    def __init__(self, ticks: int, what: str) -> None:
        super().__init__(f"condition {what!r} not reached within {ticks} ticks")
        self.ticks = ticks
        self.what = what
