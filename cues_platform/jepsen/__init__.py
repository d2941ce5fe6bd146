"""A Jepsen-style harness for cues_platform: real processes, real faults, an independent checker.

``cues jepsen --seed N --duration S`` (or ``python -m cues_platform.jepsen``). Modules:
:mod:`workload` (graph topology, keys, the rejection rule), ``user/jepsen_graph.py`` (the graph,
as a user's file), :mod:`feeders` (producer processes), :mod:`nemesis` (faults),
:mod:`checker` (reads the Delta tables with deltalake only), :mod:`run` (orchestration, report).
See docs/jepsen.md.
"""
