"""Asset keys of queues: one place, below every module of the Dagster face that names them."""

from __future__ import annotations

from collections.abc import Sequence

from dagster import AssetKey


def queue_key(name: str, prefix: Sequence[str] = ()) -> AssetKey:
    """The asset key of queue ``name`` under ``prefix`` (a graph's definitions' key prefix)."""
    return AssetKey([*prefix, name])
