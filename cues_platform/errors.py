"""The one exception root of cues_platform.

Every error a user can cause is a :class:`CuesError` subclass that names what was wrong and what to
do, carries its data as attributes (queue, partition, offset, hash, ...), and says whether retrying
the same call can help (``retryable``), in the manner of dlt's ``common/exceptions.py``.
"""

from __future__ import annotations

from typing import Any


class CuesError(Exception):
    """Root of every cues_platform error.

    ``retryable`` is True when the same call may succeed if tried again unchanged (a lost race, a
    transient storage error); False when the input or the state must change first.
    """

    retryable: bool = False

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data = data
        for key, value in data.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return self.message


class ConfigurationError(CuesError):
    """A setting is missing or invalid (a path, a URL, an option value)."""


class JavaNotFoundError(ConfigurationError):
    """Spark needs Java 17+ and none was found."""


class TransientStorageError(CuesError):
    """The storage refused or failed a call in a way that retrying can fix."""

    retryable = True
