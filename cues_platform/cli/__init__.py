"""The ``cues`` command line: ``root.py`` assembles one module per command group (``demo``,
``queue``, ``audit``, ``backing``, ``graph``, ``run``, ``processor``, ``txn``; ``participant``,
``jepsen`` and ``spark`` live with their packages); ``common.py`` holds what they share.

``cues`` (pyproject's entry point ``cues_platform.cli:main``) and ``python -m cues_platform.cli``
run the same group.
"""

from cues_platform.cli.common import CuesGroup
from cues_platform.cli.queue import queue_maintain
from cues_platform.cli.root import main

__all__ = ["CuesGroup", "main", "queue_maintain"]
