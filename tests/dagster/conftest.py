"""Fixtures of the Dagster tests: the test graph's definitions bound to a temporary lake and to
the test session's Spark (``CuesSparkResource`` getOrCreate returns the ``spark`` fixture's
session: Dagster never starts a second one)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dagster import DagsterInstance, instance_for_test

from cues_platform.dagster import CuesSparkResource, LakeResource, build_definitions
from cues_platform.queues import Lake
from tests.dagster.graphs import build_graph


@pytest.fixture
def lake_resource(lake: Lake, spark: Any) -> LakeResource:
    return LakeResource(root=lake.root)


@pytest.fixture
def graph():
    return build_graph()


@pytest.fixture
def defs(graph, lake_resource: LakeResource):
    return build_definitions(graph, lake=lake_resource, spark=CuesSparkResource())


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as inst:
        yield inst


def assets_of(defs, *, checks: bool = True) -> list[Any]:
    """Every asset definition (processor multi-assets and external specs) of ``defs``, and its
    asset checks (``materialize`` runs only the checks it is given)."""
    return [*(defs.assets or []), *((defs.asset_checks or []) if checks else [])]


def resources_of(defs) -> dict[str, Any]:
    return dict(defs.resources or {})
