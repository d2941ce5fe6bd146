"""The participants package in floors, as its docstring lists them: every import between two of
its modules (module level, in a function or type-only) goes to a module listed before."""

from __future__ import annotations

import re

import cues_platform.participants as participants
from cues_platform.devtools.import_graph import edges

PKG = "cues_platform.participants."


def _floor_order() -> list[str]:
    """The modules in the order the package docstring lists them (its numbered floors)."""
    doc = participants.__doc__ or ""
    floors = doc[doc.index("\n1. "):]
    return re.findall(r"``([a-z_]+)``", floors)


def test_every_module_is_listed_once_in_the_floors() -> None:
    order = _floor_order()
    on_disk = {e.source[len(PKG):] for e in edges() if e.source.startswith(PKG)}
    assert len(order) == len(set(order))
    assert on_disk <= set(order), f"not in the docstring's floors: {sorted(on_disk - set(order))}"


def test_every_import_goes_to_a_module_listed_before() -> None:
    pos = {m: i for i, m in enumerate(_floor_order())}
    upward = [f"{e.source}:{e.line} -> {e.target} ({e.kind})" for e in edges()
              if e.source.startswith(PKG) and e.target.startswith(PKG)
              and pos[e.target[len(PKG):]] >= pos[e.source[len(PKG):]]]
    assert upward == []
