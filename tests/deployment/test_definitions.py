"""The reference deployment's Dagster definitions load and name their assets and resources."""

from __future__ import annotations

from dagster import AssetKey


def test_definitions_load() -> None:
    from definitions import defs

    repo = defs.get_repository_def()
    assert AssetKey("queue_demo") in repo.asset_graph.get_all_asset_keys()
    assert "lake" in repo.get_top_level_resources()
