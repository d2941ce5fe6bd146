"""Typed errors of the processing layer (all under :class:`cues_platform.errors.CuesError`).

The sink helpers' errors (:class:`SinkError` and its subclasses) and the graph loader's
:class:`GraphLoadError` live here too; ``cues_platform.processing.sinks`` and
``cues_platform.processing.loader`` re-export them under their old names.
"""

from __future__ import annotations

from cues_platform.errors import CuesError


class ProcessingError(CuesError):
    """Root of processing-layer errors."""


class GraphError(ProcessingError):
    """A graph is invalid: names the processor and the binding at fault."""


class LaneMigrationError(GraphError):
    """A processor now reads every partition, but its id has a history in the lake from its
    previous bindings: its lanes, new processors, would deliver that input again."""


class GraphLoadError(ProcessingError):
    """A graph reference (``module:attr`` / ``file.py:attr``) cannot be resolved to a Graph."""


class ProcessorFencedError(ProcessingError):
    """A newer instance of this processor started; this one must stop (nothing was delivered)."""


class UnhandledStepError(ProcessingError):
    """The processor function failed and no error queue is configured: the processor stops and the
    next start retries the same snapshot (nothing is lost, nothing was delivered)."""

    retryable = True


class PlatformStepError(ProcessingError):
    """A step failed for a reason that is not the user's function (Delta, the file system, Spark or
    Py4J infrastructure, the platform's own errors): the processor stops, nothing of the step was
    delivered, no error row was written, and the next start retries the same input ranges with the
    same delivery hash (at_most_once: the step's input is lost, as that strategy allows).

    Data: ``processor``, ``step``, ``delivery_hash``, ``phase`` (what the step was doing) and
    ``cause_type`` (the qualified type of the underlying exception, also chained as ``__cause__``).
    """

    retryable = True


class RecoveryError(ProcessingError):
    """The backing queue is in a state recovery cannot resolve (for example staged files lost)."""


class SinkError(ProcessingError):
    """Root of sink errors; ``processor``, ``step`` and ``hash`` name the delivery."""


class InvalidSinkInputError(SinkError):
    """A context, table name, mode or batch is invalid; fix the call, retrying cannot help."""


class SinkSchemaError(SinkError):
    """The batch does not fit the schema of the existing Delta table."""


class DeliveryHashReusedError(SinkError):
    """The delivery hash is already recorded for another processor or step."""


class SinkConflictError(SinkError):
    """Other writers kept conflicting with this commit; retrying later is safe and can succeed."""

    retryable = True


class SinkStorageError(SinkError):
    """The store failed or the connection dropped; the outcome is unknown, retrying is safe."""

    retryable = True


class SimulatedCrash(BaseException):  # noqa: N818 - a crash, not an error
    """Raised by test hooks to crash a step at an exact point (escapes every ``except Exception``)."""
