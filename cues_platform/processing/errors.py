"""Typed errors of the processing layer (all under :class:`cues_platform.errors.CuesError`)."""

from __future__ import annotations

from cues_platform.errors import CuesError


class ProcessingError(CuesError):
    """Root of processing-layer errors."""


class GraphError(ProcessingError):
    """A graph is invalid: names the processor and the binding at fault."""


class ProcessorFencedError(ProcessingError):
    """A newer instance of this processor started; this one must stop (nothing was delivered)."""


class UnhandledStepError(ProcessingError):
    """The processor function failed and no error queue is configured: the processor stops and the
    next start retries the same snapshot (nothing is lost, nothing was delivered)."""

    retryable = True


class RecoveryError(ProcessingError):
    """The backing queue is in a state recovery cannot resolve (for example staged files lost)."""


class SimulatedCrash(BaseException):  # noqa: N818 - a crash, not an error
    """Raised by test hooks to crash a step at an exact point (escapes every ``except Exception``)."""
