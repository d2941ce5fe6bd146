"""The lake root as a Dagster resource (local folder by default, any delta-rs URI by EnvVar)."""

from __future__ import annotations

from dagster import ConfigurableResource, Definitions, EnvVar

from cues_platform.queues import Lake


class LakeResource(ConfigurableResource):
    """Where the queues live. ``root`` defaults to ``CUES_LAKE`` or ``./lake``."""

    root: str = "lake"

    def lake(self) -> Lake:
        return Lake(root=self.root)


def lake_resource() -> LakeResource:
    import os

    return LakeResource(root=EnvVar("CUES_LAKE") if os.environ.get("CUES_LAKE") else "lake")


defs = Definitions(resources={"lake": lake_resource()})
