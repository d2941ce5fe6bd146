"""Tools for developing cues_platform itself (the import graph and its checks)."""
