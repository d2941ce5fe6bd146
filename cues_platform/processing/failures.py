"""Whose failure is it? Classifying a step's exception at its source.

Only what the user's code raises (and a contract break) is a *handled* failure: it becomes an
error row and the step is delivered. Everything else — Delta, the file system, Py4J/Spark
infrastructure, the platform's own errors — is a *platform* failure: the step stops, nothing is
delivered, and the next start retries the same snapshot with the same hash.

The auditor reads the ``exception_type`` column of error rows written by any version and uses
:func:`origin_of_exception_type` to report rows that a platform failure put there.

At the source, a step classifies a live exception with :func:`origin_of` and the :class:`Phase`
it escaped from:

- ``READ``: planning and opening the input frames. Always the platform's (a missing data file,
  Delta, Spark unavailable): the user's code has not run yet.
- ``FUNCTION``: escaped ``processor.fn(...)``. The user's, unless it is a platform type: Py4J
  errors (network, JVM gone, an unconverted Java exception such as a lost executor or a missing
  file), Spark Connect transport errors, ``deltalake`` errors, ``cues_platform`` errors that are
  not contract breaks, and an ``OSError`` raised from inside py4j/pyspark/deltalake/cues_platform.
  An ``OSError`` the user's own code raises is the user's.
- ``MATERIALIZE``: Spark is lazy, so turning the returned DataFrame into Arrow runs the user's
  plan. The user's when the user's logic failed on the executors (a UDF raised: ``PythonException``;
  ANSI arithmetic, cast, date/time and other Spark runtime errors; ``AnalysisException``), or the
  returned value is not a table; the platform's otherwise (Py4J/Java failures such as
  ``SparkFileNotFoundException`` or a lost executor, ``OSError``, ``MemoryError``, Delta, and a
  pyspark error raised by the Python client itself, such as ``PySparkValueError``: only the
  platform calls pyspark's API in this phase).
- ``STAGE``: conforming to the output queues and writing the staged files. A contract break is
  handled; anything else (disk, Arrow I/O) is the platform's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from types import TracebackType

from cues_platform.errors import CuesError

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
    "pyspark.errors.exceptions.connect.SparkException",  # Connect's fallback for a JVM failure
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


class Phase(StrEnum):
    READ = "reading the inputs"
    FUNCTION = "running the function"
    MATERIALIZE = "materializing the function's result"
    STAGE = "staging the outputs"


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _mro_names(exc: BaseException) -> set[str]:
    return {qualified_name(c) for c in type(exc).__mro__}


# pyspark's converted exceptions (classic ``captured`` and ``connect`` both subclass these bases)
# that mean the user's plan failed on its own terms: bad column, UDF raised, ANSI arithmetic, cast
# (``NumberFormatException`` is an ``IllegalArgumentException``), date/time, runtime assertions.
_SPARK_USER_BASES = frozenset(f"pyspark.errors.exceptions.base.{n}" for n in (
    "AnalysisException", "PythonException", "ArithmeticException", "NumberFormatException",
    "DateTimeException", "IllegalArgumentException", "ArrayIndexOutOfBoundsException",
    "UnsupportedOperationException", "SparkRuntimeException", "SparkNoSuchElementException",
    "SparkUpgradeException", "QueryExecutionException", "PickleException",
))
# Never the user's: the JVM or the connection to it failed, or Spark could not convert a Java
# exception (a lost executor, SparkFileNotFoundException, OutOfMemoryError, SparkContext shut down).
_SPARK_PLATFORM_BASES = frozenset({
    "py4j.protocol.Py4JError",  # Py4JNetworkError, Py4JJavaError (unconverted), Py4JAuthenticationError
    "pyspark.errors.exceptions.base.UnknownException",
    "pyspark.errors.exceptions.connect.SparkConnectGrpcException",
    "pyspark.errors.exceptions.base.StreamingPythonRunnerInitializationException",
})
# pyspark's own Python-side errors that mean the JVM or the session is gone.
_SPARK_PLATFORM_CONDITIONS = frozenset({
    "JAVA_GATEWAY_EXITED", "CANNOT_CONFIGURE_SPARK_CONNECT", "SESSION_OR_CONTEXT_NOT_EXISTS",
    "NO_ACTIVE_SESSION", "NO_ACTIVE_OR_DEFAULT_SESSION", "SPARK_CONNECT_RETRIES_EXCEEDED",
})
# A file of the plan is gone. Spark Connect sends the unresolved plan with every action, so the
# server resolves the input files again while the result is materialized: a step's input file
# that vanished after step 2 surfaces as an AnalysisException there, never the user's logic.
_MISSING_FILE_CONDITIONS = frozenset({"PATH_NOT_FOUND"})
_PLATFORM_MODULE_PREFIXES = ("py4j", "pyspark", "deltalake", "cues_platform", "grpc")


def _spark_origin(exc: BaseException) -> Origin | None:
    """The origin of a Spark/Py4J exception, or None when ``exc`` is not one."""
    names = _mro_names(exc)
    if names & _SPARK_PLATFORM_BASES:
        # Spark Connect converts user failures too: they subclass both (e.g. connect.PythonException).
        return Origin.USER if names & _SPARK_USER_BASES else Origin.PLATFORM
    if names & _SPARK_USER_BASES:
        return Origin.USER
    if "pyspark.errors.exceptions.base.PySparkException" in names:
        condition = getattr(exc, "_errorClass", None)
        return Origin.PLATFORM if condition in _SPARK_PLATFORM_CONDITIONS else Origin.USER
    if "pyspark.errors.exceptions.connect.RetriesExceeded" in names:
        return Origin.PLATFORM
    return None


def _python_side_pyspark_error(exc: BaseException) -> bool:
    """A pyspark error raised by the Python client itself (``PySparkValueError``...), not one
    converted from the JVM or the Connect server (those subclass ``captured``/``connect`` types).
    While materializing, only the platform calls pyspark's API (``toArrow``, ``write``), so such
    an error is ours: filing it as the user's would send every step to the error queue. Found by
    Spark Connect, whose writer refused ``mode("errorifexists")``."""
    names = _mro_names(exc)
    if "pyspark.errors.exceptions.base.PySparkException" not in names:
        return False
    converted = ("pyspark.errors.exceptions.captured.", "pyspark.errors.exceptions.connect.")
    return not any(n.startswith(converted) for n in names)


def _raised_in_platform_code(exc: BaseException) -> bool:
    """True when the innermost frame of ``exc``'s traceback is in py4j/pyspark/deltalake/cues_platform."""
    tb: TracebackType | None = exc.__traceback__
    module = None
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        tb = tb.tb_next
    return bool(module) and str(module).split(".")[0] in _PLATFORM_MODULE_PREFIXES


def origin_of(exc: BaseException, *, phase: Phase) -> Origin:
    """Whose failure is ``exc``, which escaped the step during ``phase``? (See the module doc.)"""
    if phase is Phase.READ:
        return Origin.PLATFORM
    names = _mro_names(exc)
    if names & CONTRACT_EXCEPTION_TYPES:
        return Origin.CONTRACT
    if isinstance(exc, CuesError):
        return Origin.PLATFORM  # the platform's own failure (Delta, fencing, a sink's storage)
    if any(n.startswith("deltalake.") for n in names):
        return Origin.PLATFORM
    if phase is Phase.MATERIALIZE and _python_side_pyspark_error(exc):
        return Origin.PLATFORM  # our own call into pyspark's API refused, before the plan ran
    if phase is Phase.MATERIALIZE and getattr(exc, "_errorClass", None) in _MISSING_FILE_CONDITIONS:
        return Origin.PLATFORM  # Spark Connect analyzes the plan again at execution: see above
    spark = _spark_origin(exc)
    if spark is not None:
        return spark
    if phase is Phase.STAGE:
        return Origin.PLATFORM
    if isinstance(exc, MemoryError):
        return Origin.PLATFORM
    if isinstance(exc, OSError):
        if phase is Phase.MATERIALIZE:
            return Origin.PLATFORM
        return Origin.PLATFORM if _raised_in_platform_code(exc) else Origin.USER
    return Origin.USER


_PY_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")  # "module.Class: message" (or "Class")


def exception_type_of(exc: BaseException) -> str:
    """The qualified type an error row names: the user's own class for a UDF that raised on an
    executor (parsed from the worker's traceback in pyspark's ``PythonException``), else the type
    of ``exc``."""
    names = _mro_names(exc)
    if "pyspark.errors.exceptions.base.PythonException" in names:
        text = str(getattr(exc, "_desc", None) or getattr(exc, "_message", None) or exc)
        start = text.rfind("Traceback (most recent call last):")
        if start != -1:
            for line in text[start:].splitlines()[1:]:
                if line[:1].isspace() or not line:
                    continue
                match = _PY_EXC_LINE.match(line)
                if match:
                    name = match.group(1)
                    return name if "." in name else f"builtins.{name}"
                break
    return qualified_name(type(exc))





class StepFailure(Exception):  # noqa: N818 - internal carrier, never escapes the steppers
    """An exception that escaped step 2 or 3, with the phase it escaped from and its origin."""

    def __init__(self, cause: Exception, phase: Phase) -> None:
        super().__init__(str(cause))
        self.cause, self.phase = cause, phase
        self.origin = origin_of(cause, phase=phase)


@contextmanager
def failing_as(phase: Phase) -> Iterator[None]:
    """Classify an exception escaping the block (``BaseException``s such as a crash pass through)."""
    try:
        yield
    except StepFailure:
        raise
    except Exception as exc:  # noqa: BLE001 - classified at its source, re-raised below
        raise StepFailure(exc, phase) from exc


__all__ = ["StepFailure", "failing_as", "CONTRACT_EXCEPTION_TYPE", "CONTRACT_EXCEPTION_TYPES", "Origin", "PLATFORM_TYPE_PREFIXES", "Phase",
           "exception_type_of", "origin_of", "origin_of_exception_type", "qualified_name"]
