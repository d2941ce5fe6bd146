"""The lake: a local folder by default (``./lake``), any delta-rs URI with ``CUES_LAKE``."""

from __future__ import annotations

import os

from dagster import EnvVar

from cues_platform.dagster import LakeResource


def lake_resource() -> LakeResource:
    """``$CUES_LAKE`` (resolved by Dagster at run time, never stored in run config) or ``./lake``."""
    return LakeResource(root=EnvVar("CUES_LAKE")) if os.environ.get("CUES_LAKE") else LakeResource()


lake = lake_resource()
