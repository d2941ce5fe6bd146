"""The package's import graph, read from the code: every import statement between its modules.

Each edge records whether the import runs at module level, inside a function, or only for the
type checker (``if TYPE_CHECKING:``). The no-circle test (``tests/test_architecture.py``) fails on
any circle among all three kinds; docs/architecture.md's map is drawn from :func:`mermaid`.

    python -m cues_platform.devtools.import_graph            # list circles and in-function imports
    python -m cues_platform.devtools.import_graph --mermaid  # the package-level picture
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT_PACKAGE = "cues_platform"
Kind = Literal["module", "function", "type"]
LAZY = re.compile(r"#\s*lazy:\s*(.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    kind: Kind
    lazy_reason: str = ""  # the `# lazy: why` comment an in-function import must carry


def package_dir() -> Path:
    return Path(__file__).resolve().parents[1]


def modules(root: Path | None = None) -> dict[str, Path]:
    """Every module of the package by dotted name (a package is named by its ``__init__``)."""
    root = root or package_dir()
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Visitor(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str], lines: list[str]) -> None:
        self.module, self.is_package, self.known, self.lines = module, is_package, known, lines
        self.edges: list[Edge] = []
        self._function = 0
        self._type_only = 0

    def _kind(self) -> Kind:
        return "type" if self._type_only else ("function" if self._function else "module")

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._function += 1
        self.generic_visit(node)
        self._function -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815 (ast.NodeVisitor's naming)

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._type_only += 1
            for child in node.body:
                self.visit(child)
            self._type_only -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def _add(self, target: str, node: ast.stmt) -> None:
        if target == self.module:
            return
        text = " ".join(self.lines[node.lineno - 1: (node.end_lineno or node.lineno)])
        match = LAZY.search(text)
        self.edges.append(Edge(self.module, target, node.lineno, self._kind(),
                               match.group(1).strip() if match else ""))

    def _resolve(self, name: str) -> str | None:
        """The longest known module that ``name`` starts with."""
        parts = name.split(".")
        for n in range(len(parts), 0, -1):
            candidate = ".".join(parts[:n])
            if candidate in self.known:
                return candidate
        return None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] == ROOT_PACKAGE and (t := self._resolve(alias.name)):
                self._add(t, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            package = self.module.split(".") if self.is_package else self.module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, base] if base else package)
        if base.split(".")[0] != ROOT_PACKAGE:
            return
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            target = sub if sub in self.known else self._resolve(base)
            if target:
                self._add(target, node)


def edges(root: Path | None = None) -> list[Edge]:
    mods = modules(root)
    known = set(mods)
    out: list[Edge] = []
    for name, path in mods.items():
        text = path.read_text()
        visitor = _Visitor(name, path.name == "__init__.py", known, text.splitlines())
        visitor.visit(ast.parse(text, filename=str(path)))
        out.extend(visitor.edges)
    return out


def circles(graph_edges: Iterable[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for e in graph_edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:  # recursion depth is bounded by the package's size
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def group_of(module: str) -> str:
    """The package-level room of a module: ``cues_platform.queues.lake`` -> ``queues``.

    A ``__main__`` module is an entry point, the top of the house: its own room (``audit.__main__``
    may call the CLI without tying ``audit`` to ``cli``)."""
    parts = module.split(".")
    if parts[-1] == "__main__":
        return ".".join(parts[1:])
    return parts[1] if len(parts) > 1 else parts[0]


def group_edges(graph_edges: Iterable[Edge]) -> set[tuple[str, str]]:
    return {(group_of(e.source), group_of(e.target)) for e in graph_edges
            if group_of(e.source) != group_of(e.target)}


def room_graph(graph_edges: Iterable[Edge], package: str | None = None) -> dict[str, set[str]]:
    """Who imports whom: packages of the root (``package=None``), or the modules inside
    ``package`` (e.g. ``"queues"``), named without the common prefix."""
    rooms: dict[str, set[str]] = {}
    prefix = f"{ROOT_PACKAGE}.{package}." if package else ""

    def room(module: str) -> str | None:
        if package is None:
            return group_of(module)
        if module == prefix[:-1]:
            return "__init__"
        return module.removeprefix(prefix) if module.startswith(prefix) else None

    for e in graph_edges:
        a, b = room(e.source), room(e.target)
        if a is None or b is None:
            continue
        rooms.setdefault(a, set())
        rooms.setdefault(b, set())
        if a != b:
            rooms[a].add(b)
    return rooms


def floors(rooms: dict[str, set[str]]) -> dict[str, int]:
    """Each room's floor: 0 for a room importing no other, else one above its highest import.
    The graph must have no circle (:func:`circles`)."""
    out: dict[str, int] = {}

    def floor(room: str) -> int:
        if room not in out:
            out[room] = 1 + max((floor(r) for r in rooms[room]), default=-1)
        return out[room]

    for room in rooms:
        floor(room)
    return out


def reduced(rooms: dict[str, set[str]]) -> dict[str, set[str]]:
    """The transitive reduction: an arrow a -> b is left out when a reaches b another way."""

    def reach_without(a: str, b: str) -> bool:
        """Whether ``a`` reaches ``b`` without taking the arrow a -> b."""
        seen: set[str] = set()
        todo = [r for r in rooms[a] if r != b]
        while todo:
            room = todo.pop()
            if room == b:
                return True
            if room not in seen:
                seen.add(room)
                todo.extend(rooms[room])
        return False

    return {a: {b for b in targets if not reach_without(a, b)} for a, targets in rooms.items()}


def mermaid(graph_edges: Iterable[Edge], package: str | None = None) -> str:
    """The import graph as a Mermaid flowchart, one row per floor (top imports bottom), arrows
    pointing at what is imported; arrows implied by others are left out (:func:`reduced`)."""
    rooms = room_graph(graph_edges, package)
    levels = floors(rooms)
    ident = {r: "n_" + r.replace(".", "_") for r in rooms}
    lines = ["flowchart TD"]
    for level in sorted(set(levels.values()), reverse=True):
        members = sorted(r for r in rooms if levels[r] == level)
        lines.append(f'    subgraph f{level}["floor {level}"]')
        lines += [f'        {ident[r]}["{r}"]' for r in members]
        lines.append("    end")
    for a, targets in sorted(reduced(rooms).items()):
        lines += [f"    {ident[a]} --> {ident[b]}" for b in sorted(targets)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mermaid", action="store_true", help="print the package-level picture")
    parser.add_argument("--package", help="with --mermaid: the modules inside this package")
    args = parser.parse_args(argv)
    found = edges()
    if args.mermaid:
        print(mermaid(found, args.package), end="")
        return 0
    for circle in circles(found):
        print("circle:", " ".join(circle))
    package_circles = circles(Edge(f"{ROOT_PACKAGE}.{a}", f"{ROOT_PACKAGE}.{b}", 0, "module")
                              for a, b in group_edges(found))
    for circle in package_circles:
        print("package circle:", " ".join(circle))
    for e in found:
        if e.kind == "function" and not e.lazy_reason:
            print(f"in-function import: {e.source}:{e.line} -> {e.target}")
    return 1 if circles(found) or package_circles else 0


if __name__ == "__main__":
    raise SystemExit(main())
