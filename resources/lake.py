"""The lake: a local folder by default (``./lake``), any delta-rs URI with ``CUES_LAKE``.

Both resources leave ``root`` unset, so the run process reads it from ``cues_platform.settings``
when the run opens the lake (``$CUES_LAKE`` / ``$CUES_PARTICIPANTS_LAKE``, never at load time and
never stored in run config).
"""

from __future__ import annotations

from cues_platform.dagster import LakeResource
from cues_platform.settings import DEFAULTS

PARTICIPANTS_LAKE_ENV = "CUES_PARTICIPANTS_LAKE"
DEFAULT_PARTICIPANTS_LAKE = DEFAULTS.participants_lake


def lake_resource() -> LakeResource:
    """``$CUES_LAKE`` or ``./lake``, resolved in the run process (settings ``lake``)."""
    return LakeResource()


def participants_lake_resource() -> LakeResource:
    """The postings protocol's queues (``assets/participants.py``): ``$CUES_PARTICIPANTS_LAKE`` or
    ``./lake-participants`` -- not the payments lake, whose ``postings``/``results`` queues have
    other schemas (pass the same root to ``cues participant ... --lake``)."""
    return LakeResource(root_setting="participants_lake")


lake = lake_resource()
participants_lake = participants_lake_resource()
