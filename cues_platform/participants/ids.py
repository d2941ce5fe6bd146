"""THE rule for participant ids (a participant id is a POSTINGS/RESULTS subject and names a
database), with no dependency: the database layer (``db.py``) and the network (``network.py``,
which re-exports it) both use it.
"""

from __future__ import annotations

import re

from cues_platform.participants.errors import ParticipantConfigError

ID_MAX = 64  # a participant id is a POSTINGS/RESULTS subject: partitions have 64 characters at most
_ID = re.compile(rf"[a-z][a-z0-9_-]{{0,{ID_MAX - 1}}}")  # fullmatch: `$` accepts a trailing "\n"


def validate_participant(participant: object) -> str:
    """THE rule for participant ids, used by every command and function that takes one: a
    lowercase letter, then lowercase letters, digits, ``-`` or ``_``; 64 characters at most.

    Lowercase only, so that no two ids differ by case alone (``Bank-A`` and ``bank-a`` would be two
    subjects but one database on a case-folding mapping); ``db.database_name`` maps valid ids to
    databases injectively."""
    if isinstance(participant, str) and _ID.fullmatch(participant):
        return participant
    hint = ""
    if isinstance(participant, str) and _ID.fullmatch(participant.lower()):
        hint = f" (ids are lowercase: {participant.lower()!r})"
    raise ParticipantConfigError(
        f"invalid participant id {participant!r}: use a lowercase letter, then lowercase letters, "
        f"digits, '-' or '_', {ID_MAX} characters at most{hint}", participant=participant
    )
