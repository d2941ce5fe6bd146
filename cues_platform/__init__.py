"""cues_platform."""
