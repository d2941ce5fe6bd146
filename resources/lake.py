"""The lake: a local folder by default (``./lake``), any delta-rs URI with ``CUES_LAKE``."""

from __future__ import annotations

import os

from dagster import EnvVar

from cues_platform.dagster import LakeResource


def lake_resource() -> LakeResource:
    """``$CUES_LAKE`` (resolved by Dagster at run time, never stored in run config) or ``./lake``."""
    return LakeResource(root=EnvVar("CUES_LAKE")) if os.environ.get("CUES_LAKE") else LakeResource()


PARTICIPANTS_LAKE_ENV = "CUES_PARTICIPANTS_LAKE"
DEFAULT_PARTICIPANTS_LAKE = "lake-participants"


def participants_lake_resource() -> LakeResource:
    """The postings protocol's queues (``assets/participants.py``): ``$CUES_PARTICIPANTS_LAKE`` or
    ``./lake-participants`` -- not the payments lake, whose ``postings``/``results`` queues have
    other schemas (pass the same root to ``cues participant ... --lake``)."""
    if os.environ.get(PARTICIPANTS_LAKE_ENV):
        return LakeResource(root=EnvVar(PARTICIPANTS_LAKE_ENV))
    return LakeResource(root=DEFAULT_PARTICIPANTS_LAKE)


lake = lake_resource()
participants_lake = participants_lake_resource()
