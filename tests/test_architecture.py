"""The house's rules, checked on the code: no import circle, packages on floors, lazy imports named.

The graph is read by ``cues_platform.devtools.import_graph`` from every import statement of the
package, at module level, inside functions and under ``TYPE_CHECKING`` alike.
"""

from __future__ import annotations

from cues_platform.devtools.import_graph import (
    Edge,
    circles,
    edges,
    floors,
    group_edges,
    modules,
    reduced,
)
from cues_platform.devtools.pages import stale

GRAPH = edges()


def test_no_module_imports_another_in_a_circle() -> None:
    assert circles(GRAPH) == []


def test_no_package_imports_another_in_a_circle() -> None:
    packages = [Edge(a, b, 0, "module") for a, b in group_edges(GRAPH)]
    assert circles(packages) == []


def test_every_import_inside_a_function_names_why_it_is_lazy() -> None:
    """An in-function import is allowed only to put off a heavy or optional dependency, and says
    so with a ``# lazy: <reason>`` comment on the import."""
    unexplained = [f"{e.source}:{e.line} -> {e.target}" for e in GRAPH
                   if e.kind == "function" and not e.lazy_reason]
    assert unexplained == []


# docs/architecture.md, "Storage": the floors of queues/, each in its order
QUEUE_FLOORS = [
    ["errors", "names", "schema", "filesystems", "faults", "confine", "spark_values"],
    ["layout", "based", "integrity", "creation", "snapshot_cache", "writer_lock"],
    ["location", "handle", "parallel_files"],
    ["appender", "by_reference", "idempotence", "producer", "maintenance", "positions",
     "coordinator", "transactions", "reader", "tailer", "retention"],
    ["queue", "lake", "__init__"],
]


def test_queues_modules_import_only_downward_as_the_architecture_page_says() -> None:
    """A module imports only from lower floors and from modules listed before it on its own."""
    rank = {m: (f, i) for f, mods in enumerate(QUEUE_FLOORS) for i, m in enumerate(mods)}
    package = "cues_platform.queues"
    named = {m.removeprefix(package + ".") for m in modules() if m.startswith(package + ".")}
    assert named == set(rank) - {"__init__"}, "a queues module is on no floor (or a floor lists a gone one)"
    upward = []
    for e in GRAPH:
        if not (e.source.startswith(package) and e.target.startswith(package + ".")):
            continue
        src = e.source.removeprefix(package).lstrip(".") or "__init__"
        dst = e.target.removeprefix(package + ".")
        (fs, i), (fd, j) = rank[src], rank[dst]
        if (fd, j) >= (fs, i):
            upward.append(f"{src} -> {dst}")
    assert upward == []


def test_the_graph_reader_sees_circles_and_every_kind_of_import(tmp_path) -> None:
    """The checker itself: a circle through a function-level and a type-only import is found."""
    pkg = tmp_path / "cues_platform"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from cues_platform.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import X\n")
    (pkg / "sub" / "c.py").write_text("import cues_platform.sub.a  # lazy: not really\n")
    found = edges(pkg)
    assert circles(found) == [["cues_platform.sub.a", "cues_platform.sub.b", "cues_platform.sub.c"]]
    kinds = {(e.source.rsplit(".", 1)[1], e.kind, e.lazy_reason) for e in found}
    assert kinds == {("a", "function", ""), ("b", "type", ""), ("c", "module", "not really")}


def test_the_picture_puts_each_room_above_what_it_imports_and_drops_implied_arrows() -> None:
    rooms = {"a": {"b", "c"}, "b": {"c"}, "c": set()}
    assert floors(rooms) == {"a": 2, "b": 1, "c": 0}
    assert reduced(rooms) == {"a": {"b"}, "b": {"c"}, "c": set()}


def test_the_generated_pages_are_current() -> None:
    """docs/app-transactions.md and docs/architecture.md's import-graph pictures are what the code
    generates now (``python -m cues_platform.devtools.pages --write`` regenerates them)."""
    assert stale() == []
