"""Validation of user-supplied names and lake paths (no traversal, no surprises on any store)."""

from __future__ import annotations

import re

from cues_platform.queues.errors import InvalidNameError

# Always matched with fullmatch: `re.match` with `$` accepts a trailing newline ("x\n"), which
# made a queue folder that broke every listing, and a partition no read could find.
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,127}")
_PARTITION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,199}")


def validate_name(name: object, *, kind: str = "queue") -> str:
    """Return ``name`` if it is a legal queue/processor/tailer name, else raise.

    Legal: a letter, then up to 127 letters, digits, ``_`` or ``-``. No dots, slashes or spaces,
    so a name can never climb out of the lake root or collide with Delta's own files.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidNameError(
            f"invalid {kind} name {name!r}: use a letter followed by up to 127 letters, digits, "
            "'_' or '-' (no '/', '.', spaces or '..')",
            name=name,
            kind=kind,
        )
    return name


def validate_processor_id(value: object) -> str:
    """Return ``value`` if it is a processor id: a name, or a lane's ``name.partition`` (one
    processor over every partition of a queue runs one lane per partition:
    ``cues_platform/processing/lanes.py``). Safe as a folder name: no '/', no '..'."""
    family, dot, partition = value.partition(".") if isinstance(value, str) else (value, "", "")
    validate_name(family, kind="processor")
    if dot:
        validate_partition(partition)
    return value  # type: ignore[return-value]


def validate_partition(partition: object) -> str:
    """Return ``partition`` if it is a legal partition (subject) name, else raise."""
    if not isinstance(partition, str) or not _PARTITION.fullmatch(partition) or ".." in partition:
        raise InvalidNameError(
            f"invalid partition {partition!r}: use up to 64 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit",
            name=partition,
            kind="partition",
        )
    return partition


def validate_id(value: object, *, kind: str) -> str:
    """Return ``value`` if it is a legal producer/transactional id, else raise."""
    if not isinstance(value, str) or not _ID.fullmatch(value) or ".." in value:
        raise InvalidNameError(
            f"invalid {kind} {value!r}: use up to 200 letters, digits, '_', '.', ':', '@' or '-', "
            "starting with a letter or digit (no '..')",
            name=value,
            kind=kind,
        )
    return value


def join_uri(root: str, *parts: str) -> str:
    """Join already-validated name parts under a lake root URI or local path."""
    return "/".join([root.rstrip("/"), *parts])
