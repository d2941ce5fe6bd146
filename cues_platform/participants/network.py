"""The network: the POSTINGS and RESULTS queues, and which participants are registered.

POSTINGS is partitioned by the receiving participant (consumer) ``p``; RESULTS by the sender
(producer) ``n``. The queues' declared partitions ARE the registry: a consumer is registered when
POSTINGS has its subject, a producer when RESULTS has its subject.
"""

from __future__ import annotations

from collections.abc import Iterable

from cues_platform.participants.errors import UnknownParticipantError
from cues_platform.participants.ids import validate_participant
from cues_platform.participants.model import (
    POSTINGS,
    POSTINGS_SCHEMA,
    RESULTS,
    RESULTS_SCHEMA,
    Role,
)
from cues_platform.queues import Lake, Queue

PLACEHOLDER = "0"


def _queue(lake: Lake, name: str, schema, parts: list[str]) -> Queue:  # noqa: ANN001
    if lake.has_queue(name):
        q = lake.queue(name)
        missing = [p for p in parts if p not in q.partitions]
        if missing:
            q.add_partitions(missing)
        return q
    # a queue needs one partition; "0" can never be a participant id (ids start with a letter)
    return lake.create_queue(name, schema=schema, partitions=parts or [PLACEHOLDER], exist_ok=True)


def register(lake: Lake, *, producers: Iterable[str] = (), consumers: Iterable[str] = ()) -> None:
    """Declare producers (RESULTS subjects) and consumers (POSTINGS subjects); idempotent."""
    prods = [validate_participant(p) for p in producers]
    cons = [validate_participant(c) for c in consumers]
    _queue(lake, POSTINGS, POSTINGS_SCHEMA, cons)
    _queue(lake, RESULTS, RESULTS_SCHEMA, prods)


def postings(lake: Lake) -> Queue:
    if not lake.has_queue(POSTINGS):
        register(lake)
    return lake.queue(POSTINGS)


def results(lake: Lake) -> Queue:
    if not lake.has_queue(RESULTS):
        register(lake)
    return lake.queue(RESULTS)


def require(lake: Lake, participant: str, role: Role | str) -> None:
    """Raise :class:`UnknownParticipantError` unless ``participant`` is registered in ``role``."""
    participant, role = validate_participant(participant), Role(role)
    q = postings(lake) if role is Role.CONSUMER else results(lake)
    if participant not in q.partitions:
        q.refresh()
    if participant not in q.partitions:
        raise UnknownParticipantError(
            f"participant {participant!r} is not a registered {role.value} (known: "
            f"{sorted(p for p in q.partitions if p != PLACEHOLDER)}); register it first "
            f"(cues participant register --lake <lake> --{role.value} {participant})",
            participant=participant, role=role.value,
        )


def registered_roles(lake: Lake, participant: str) -> list[Role]:
    """The roles ``participant`` is registered for (read only: creates no queue)."""
    participant = validate_participant(participant)
    found = []
    for role, name in ((Role.PRODUCER, RESULTS), (Role.CONSUMER, POSTINGS)):
        if lake.has_queue(name) and participant in lake.queue(name).partitions:
            found.append(role)
    return found
