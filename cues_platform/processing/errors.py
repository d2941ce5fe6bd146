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


class RedeployError(GraphError):
    """A graph changed since the lake was last run in a way that cannot be continued exactly once
    (``processing/deployments.py``): refused before any step. Data: ``processor``, ``change``
    (what changed) and the values before/after; the message names the ways out."""


class LaneMigrationError(RedeployError):
    """A processor would read a queue partition for the first time that another processor of its
    family (a lane of the same declared processor) read and no longer reads: positions belong to
    their reader, so the new reader would deliver that input again (every-partition <-> named
    partition, a partition moved between lanes). Data: ``pairs``, ``owners``."""


class StrategyChangedError(RedeployError):
    """A processor's delivery strategy changed after it made progress: the new strategy keeps its
    positions elsewhere and would read from offset 0."""


class HomeChangedError(RedeployError):
    """An exactly_once processor's first output (its home queue, where its steps and positions
    are) changed after it delivered a step."""


class ProcessorRenamedError(RedeployError):
    """A processor id new to the lake writes the same home queue from the same input as an id the
    graph no longer has: most likely a rename, which would deliver that input again."""


class StepInFlightError(RedeployError):
    """A processor's step was recorded (its snapshot) under bindings the new graph no longer has:
    the step must be finished by the graph that began it."""


class LakeListingError(ProcessingError):
    """A folder of the lake (``_cues/backing/``, ``queues/``) cannot be listed: permissions, or the
    store refused the listing. Data: ``uri``. The auditor raises it as an ``AuditError``."""


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
