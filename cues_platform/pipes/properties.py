"""Checkers for the delivery properties named in the seed.

Each checker takes the payloads ``sent`` (in submission order, all distinct) and the payloads
``received`` (in the order the receiver sent them on) and returns ``None`` when the property
holds, or a short description of the first violation. The vocabulary:

* **at-least-once**: every sent payload was received at least once; nothing else was received;
* **strictly monotonic**: received payloads follow submission order strictly (no duplicates,
  never backwards); loss allowed;
* **monotonic**: never backwards; adjacent duplicates and loss allowed;
* **continuously ordered**: in submission order without gaps, starting at the first payload;
  a payload may repeat right after itself; a prefix of ``sent`` when incomplete;
* **absolutely ordered**: received equals sent exactly (checked on a settled pipe).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from enum import Enum


class Property(Enum):
    AT_LEAST_ONCE = "at-least-once"
    STRICTLY_MONOTONIC = "strictly monotonic"
    MONOTONIC = "monotonic"
    CONTINUOUSLY_ORDERED = "continuously ordered"
    ABSOLUTELY_ORDERED = "absolutely ordered"


def _positions(sent: Sequence[Hashable], received: Sequence[Hashable]) -> list[int] | str:
    where = {p: i for i, p in enumerate(sent)}
    if len(where) != len(sent):
        return "sent payloads must be distinct"
    out = []
    for p in received:
        if p not in where:
            return f"received {p!r}, which was never sent"
        out.append(where[p])
    return out


def at_least_once(sent: Sequence[Hashable], received: Sequence[Hashable]) -> str | None:
    pos = _positions(sent, received)
    if isinstance(pos, str):
        return pos
    missing = [p for p in sent if p not in set(received)]
    return f"lost {len(missing)} payload(s), first {missing[0]!r}" if missing else None


def strictly_monotonic(sent: Sequence[Hashable], received: Sequence[Hashable]) -> str | None:
    pos = _positions(sent, received)
    if isinstance(pos, str):
        return pos
    for a, b in zip(pos, pos[1:], strict=False):
        if b <= a:
            return f"{sent[b]!r} received after {sent[a]!r}"
    return None


def monotonic(sent: Sequence[Hashable], received: Sequence[Hashable]) -> str | None:
    pos = _positions(sent, received)
    if isinstance(pos, str):
        return pos
    for a, b in zip(pos, pos[1:], strict=False):
        if b < a:
            return f"{sent[b]!r} received after {sent[a]!r}"
    return None


def continuously_ordered(sent: Sequence[Hashable], received: Sequence[Hashable]) -> str | None:
    pos = _positions(sent, received)
    if isinstance(pos, str):
        return pos
    prev = -1
    for p in pos:
        if p not in (prev, prev + 1):
            return (
                f"{sent[p]!r} received after {sent[prev]!r}"
                if prev >= 0
                else (f"first received {sent[p]!r}, not {sent[0]!r}")
            )
        prev = p
    return None


def absolutely_ordered(sent: Sequence[Hashable], received: Sequence[Hashable]) -> str | None:
    if list(received) == list(sent):
        return None
    for i, (s, r) in enumerate(zip(sent, received, strict=False)):
        if s != r:
            return f"position {i}: expected {s!r}, received {r!r}"
    return f"expected {len(sent)} payloads, received {len(received)}"


CHECKS = {
    Property.AT_LEAST_ONCE: at_least_once,
    Property.STRICTLY_MONOTONIC: strictly_monotonic,
    Property.MONOTONIC: monotonic,
    Property.CONTINUOUSLY_ORDERED: continuously_ordered,
    Property.ABSOLUTELY_ORDERED: absolutely_ordered,
}


def check(prop: Property, sent: Sequence[Hashable], received: Sequence[Hashable]) -> str | None:
    """Check one :class:`Property`; ``None`` means it holds."""
    return CHECKS[prop](sent, received)
