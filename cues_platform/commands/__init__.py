"""Command groups of ``cues`` that ``cli.py`` adds (each module one group), and what they share."""
