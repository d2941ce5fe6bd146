"""Envelopes exchanged by pipe workers, and a JSON codec for the loopback network route.

Envelopes are frozen dataclasses: a route may duplicate, delay or reorder them, never mutate them.
Payloads are opaque to the pipes; for the loopback route they must be JSON values or envelopes
(envelopes nest when pipes compose, e.g. an :class:`Indexed` inside a :class:`Data`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from .errors import CodecError


@dataclass(frozen=True, slots=True)
class Data:
    """A payload tagged with the sender's unique message id (re-send / sequential pipes)."""

    msg_id: str
    payload: Any


@dataclass(frozen=True, slots=True)
class Confirm:
    """Receiver → sender: the message ``msg_id`` has been sent on."""

    msg_id: str


@dataclass(frozen=True, slots=True)
class Indexed:
    """A payload tagged with the sender's consecutive index (index pipes); indexes start at 1."""

    index: int
    payload: Any


@dataclass(frozen=True, slots=True)
class Append:
    """Stream sender → stream engine: store ``payload``; ``msg_id`` identifies the attempt."""

    msg_id: str
    payload: Any


@dataclass(frozen=True, slots=True)
class Appended:
    """Stream engine → stream sender: ``msg_id`` is stored at ``offset``."""

    msg_id: str
    offset: int


@dataclass(frozen=True, slots=True)
class Fetch:
    """Stream receiver → stream engine: read up to ``limit`` messages from offset ``start``."""

    request_id: int
    start: int
    limit: int


@dataclass(frozen=True, slots=True)
class Batch:
    """Stream engine → stream receiver: ``entries`` are ``(offset, payload)`` from ``start``."""

    request_id: int
    start: int
    entries: tuple[tuple[int, Any], ...]


@dataclass(frozen=True, slots=True)
class ReadIndex:
    """Stream receiver → index storage: what is my committed position?"""

    request_id: int


@dataclass(frozen=True, slots=True)
class IndexValue:
    """Index storage → stream receiver: the committed position (``None`` if never committed)."""

    request_id: int
    position: int | None


@dataclass(frozen=True, slots=True)
class CommitIndex:
    """Stream receiver → index storage: everything before ``position`` has been sent on."""

    position: int


ENVELOPES: tuple[type, ...] = (
    Data,
    Confirm,
    Indexed,
    Append,
    Appended,
    Fetch,
    Batch,
    ReadIndex,
    IndexValue,
    CommitIndex,
)
_BY_NAME = {cls.__name__: cls for cls in ENVELOPES}
_TAG = "__envelope__"


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, ENVELOPES):
        out: dict[str, Any] = {_TAG: type(value).__name__}
        for f in fields(value):
            out[f.name] = _to_jsonable(getattr(value, f.name))
        return out
    if isinstance(value, tuple | list):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_jsonable(v) for k, v in value.items()}
    return value


def _from_jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        name = value.get(_TAG)
        if name is None:
            return {k: _from_jsonable(v) for k, v in value.items()}
        cls = _BY_NAME.get(name)
        if cls is None:
            raise CodecError(f"unknown envelope type {name!r}")
        kwargs = {k: _from_jsonable(v) for k, v in value.items() if k != _TAG}
        if cls is Batch:
            kwargs["entries"] = tuple((int(o), p) for o, p in kwargs["entries"])
        return cls(**kwargs)
    if isinstance(value, list):
        return [_from_jsonable(v) for v in value]
    return value


def encode(item: Any) -> bytes:
    """Encode an envelope (or JSON value) to UTF-8 JSON bytes."""
    try:
        return json.dumps(_to_jsonable(item), separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise CodecError(f"cannot encode {type(item).__name__}: {exc}") from exc


def decode(raw: bytes) -> Any:
    """Decode bytes produced by :func:`encode`."""
    try:
        value = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"cannot decode datagram: {exc}") from exc
    try:
        return _from_jsonable(value)
    except (TypeError, KeyError) as exc:
        raise CodecError(f"malformed envelope: {exc}") from exc
