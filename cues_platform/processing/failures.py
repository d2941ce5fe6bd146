"""Whose failure is it? Classifying a step's exception at its source.

Only what the user's code raises (and a contract break) is a *handled* failure: it becomes an
error row and the step is delivered. Everything else — Delta, the file system, Py4J/Spark
infrastructure, the platform's own errors — is a *platform* failure: the step stops, nothing is
delivered, and the next start retries the same snapshot with the same hash.

The auditor reads the ``exception_type`` column of error rows written by any version and uses
:func:`origin_of_exception_type` to report rows that a platform failure put there.
"""

from __future__ import annotations

from enum import StrEnum

CONTRACT_EXCEPTION_TYPE = "cues_platform.ContractViolation"
# The user's output did not fit an output queue (wrong columns, types, nulls, partitions): a
# contract break, handled like one although the platform's own code raised it.
CONTRACT_EXCEPTION_TYPES: frozenset[str] = frozenset({
    CONTRACT_EXCEPTION_TYPE,
    "cues_platform.queues.errors.SchemaError",
    "cues_platform.queues.errors.ReservedColumnError",
    "cues_platform.queues.errors.NullValueError",
    "cues_platform.queues.errors.BatchError",
    "cues_platform.queues.errors.UnknownPartitionError",
})

# Qualified exception-type prefixes that are never the user's: an error row with one of these was
# written by a platform failure (older versions handled them as user errors).
PLATFORM_TYPE_PREFIXES: tuple[str, ...] = (
    "py4j.",
    "deltalake.",
    "cues_platform.",
    "pyspark.errors.exceptions.connect.SparkConnectGrpcException",
)


class Origin(StrEnum):
    USER = "user"
    CONTRACT = "contract"
    PLATFORM = "platform"


def origin_of_exception_type(exception_type: str) -> Origin:
    """The origin of an error row from its qualified ``exception_type`` (``module.QualName``)."""
    if exception_type in CONTRACT_EXCEPTION_TYPES:
        return Origin.CONTRACT
    if exception_type.startswith(PLATFORM_TYPE_PREFIXES):
        return Origin.PLATFORM
    return Origin.USER


__all__ = ["CONTRACT_EXCEPTION_TYPE", "CONTRACT_EXCEPTION_TYPES", "Origin", "PLATFORM_TYPE_PREFIXES", "origin_of_exception_type"]
