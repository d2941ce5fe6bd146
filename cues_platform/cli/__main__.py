"""``python -m cues_platform.cli``: the ``cues`` command."""

from cues_platform.cli.root import main

if __name__ == "__main__":
    main()
