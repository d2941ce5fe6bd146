"""Errors of the auditor (under :class:`cues_platform.errors.CuesError`).

These are raised when an audit (or a CLI command built on the auditor's readers) cannot run on its
input. What an audit *finds* is never raised: it is a :class:`~cues_platform.audit.Violation`.
"""

from __future__ import annotations

from cues_platform.errors import CuesError


class AuditError(CuesError):
    """The audit cannot run on this input (as opposed to finding violations, which it reports)."""


class LakeNotFoundError(AuditError):
    """The lake root does not exist or holds neither queues nor cues system tables."""


class NoSuchProcessorError(AuditError):
    """No backing queue for this processor id: it is not exactly-once or never ran here."""


class TableStorageError(AuditError):
    """The storage failed a queue or backing table. Carries ``table`` (the queue name or
    ``backing/{processor}``), ``uri``, ``file`` (when known) and ``reason``. Retrying does not
    help until the table (or the permissions) are repaired."""


class UnreadableTableError(TableStorageError):
    """A table cannot be opened or read: its log or a data file is missing, truncated or corrupt,
    or the storage refused the read."""


class UnwritableTableError(TableStorageError):
    """A write to a table failed in the storage: a read-only lake, a full disk, a path that is a
    file where a folder belongs."""


__all__ = [
    "AuditError",
    "LakeNotFoundError",
    "NoSuchProcessorError",
    "TableStorageError",
    "UnreadableTableError",
    "UnwritableTableError",
]
