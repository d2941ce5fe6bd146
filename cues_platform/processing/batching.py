"""How many offsets a step reads from one input: ``batch_size``, or a backlog step.

A processor that is behind by more than ``BACKLOG_FACTOR`` x ``batch_size`` offsets on an input
catches up in bigger steps: it reads everything available, up to ``max_batch_size``, so catching
up on 1M rows costs about one Spark job instead of a hundred (issue 11). A processor that keeps up
reads ``batch_size`` offsets per step, as before, so small steps keep low latency.

Off by one: the lag is ``available - start`` (``available`` is the partition's next offset); a
lag of exactly ``BACKLOG_FACTOR * batch_size`` is not a backlog.
"""

from __future__ import annotations

from cues_platform.processing.model import Options

BACKLOG_FACTOR = 10


def step_size(options: Options, *, start: int, available: int) -> int:
    """The number of offsets to ask for from ``start`` (the read may return fewer)."""
    batch = options.batch_size
    lag = available - start
    if lag <= BACKLOG_FACTOR * batch:
        return batch
    return max(batch, min(lag, options.max_batch_size))
