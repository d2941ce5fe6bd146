"""Every exception class the package defines is a :class:`CuesError` (one root: ``except
CuesError`` catches every error the platform raises), except the few listed below with the reason
each is not; and what retrying can fix is one branch of the tree (``TransientStorageError``)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import cues_platform
from cues_platform.errors import CuesError, TransientStorageError

# class -> why it is not a CuesError (a new entry needs a reason a reviewer accepts)
NOT_CUES_ERRORS = {
    "cues_platform.processing.errors.SimulatedCrash":
        "a test hook's crash: a BaseException so that it escapes every `except Exception`",
    "cues_platform.processing.failures.StepFailure":
        "internal carrier of a user's exception between the steppers' phases; never escapes them",
    "cues_platform.dagster.checks.RangesNotRecorded": "raised and caught inside dagster/checks.py",
    "cues_platform.queues.coordinator.AlreadyDecided":
        "a guard's signal inside a coordinator decision, caught by coordinator.py and "
        "transactions.py; never raised out of queues/",
    "cues_platform.queues.coordinator.PastDeadline":
        "a guard's signal inside a coordinator decision, caught by transactions.py; never raised "
        "out of queues/",
    "cues_platform.jepsen.workload.Rejected":
        "the fault harness's stand-in for a *user's* exception: the platform must treat it as the "
        "user's, so it must not be one of the platform's",
    "cues_platform.jepsen.feeders.LostAckError": "a fault the harness injects into its own feeder",
}


def _package_exceptions() -> dict[str, type[BaseException]]:
    found = {}
    for info in pkgutil.walk_packages(cues_platform.__path__, "cues_platform."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == module.__name__):
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_exception_of_the_package_is_a_cues_error_or_says_why_not() -> None:
    classes = _package_exceptions()
    assert len(classes) > 50  # the walk found the package's errors
    outside = {name for name, cls in classes.items()
               if not issubclass(cls, CuesError) and not name.rsplit(".", 1)[1].startswith("_")}
    assert outside == set(NOT_CUES_ERRORS), (
        f"not under CuesError and not listed: {sorted(outside - set(NOT_CUES_ERRORS))}; "
        f"listed but gone or fixed: {sorted(set(NOT_CUES_ERRORS) - outside)}")


def test_the_retryable_storage_errors_are_transient_storage_errors() -> None:
    from cues_platform.pipes import PipeError
    from cues_platform.queues.errors import StorageUnreachableError

    assert issubclass(StorageUnreachableError, TransientStorageError)
    assert StorageUnreachableError.retryable is True
    assert issubclass(PipeError, CuesError)
