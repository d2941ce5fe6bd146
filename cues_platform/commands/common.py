"""What the command groups share: opening the lake a command names."""

from __future__ import annotations

from cues_platform.audit.discovery import check_lake
from cues_platform.queues import Lake


def open_lake(lake_root: str) -> Lake:
    """The lake at ``lake_root``, which must exist and be a cues lake (else one clear error)."""
    lake = Lake(root=lake_root)
    check_lake(lake)
    return lake
