"""Composition: pipes are links, so a pipe can be the route of another pipe.

The builders below wire the compositions the docs and tests rely on. The central one is
:func:`exactly_once_pipe`: a continuous index pipe whose forward route is a re-send pipe with
multiple unconfirmed messages. The inner pipe turns a lossy, duplicating, reordering route into
an at-least-once one; the outer pipe's send queue and index check turn at-least-once into
absolutely ordered, i.e. exactly once and in order.
"""

from __future__ import annotations

from dataclasses import replace

from .index import Check, ContinuousIndexPipe
from .resend import ResendConfig, ResendMultiPipe, ResendPipe
from .routes import FaultSchedule, Ordering, Route, memory_route
from .sequential import SequentialConfirmPipe
from .sim import Clock


def exactly_once_pipe(
    clock: Clock,
    faults: FaultSchedule,
    *,
    check: Check = Check.STRICT,
    config: ResendConfig | None = None,
    name: str = "eo",
) -> ContinuousIndexPipe:
    """Continuous index pipe over a re-send-multi pipe over an in-memory faulty route."""
    inner = ResendMultiPipe(
        memory_route(clock, faults, name=f"{name}.wire"), config=config, name=f"{name}.inner"
    )
    return ContinuousIndexPipe(inner, check=check, name=f"{name}.outer")


def sequential_over_resend(
    clock: Clock,
    faults: FaultSchedule,
    *,
    config: ResendConfig | None = None,
    name: str = "seq",
) -> SequentialConfirmPipe:
    """Sequential confirm pipe whose forward and back routes are re-send pipes.

    Re-send pipes make both routes at-least-once, as the sequential pipe requires. Pass a FIFO
    schedule to also satisfy its unstated need that duplicates are not overtaken.
    """
    forward = ResendPipe(
        memory_route(clock, faults, name=f"{name}.fwd"), config=config, name=f"{name}.fwd"
    )
    back = ResendPipe(
        memory_route(clock, faults, name=f"{name}.back"), config=config, name=f"{name}.back"
    )
    return SequentialConfirmPipe(Route(forward=forward, back=back), name=name)


def fifo(schedule: FaultSchedule) -> FaultSchedule:
    """The same faults, but delays never reorder."""
    return replace(schedule, ordering=Ordering.FIFO)
