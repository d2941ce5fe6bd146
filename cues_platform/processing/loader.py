"""Loading a graph object named on the command line.

A reference is ``"package.module:attr"`` (imported the usual way, with the current folder on
``sys.path`` as ``python -m`` would have it) or ``"path/to/file.py:attr"`` (executed as a module
named after the file, its folder put on ``sys.path`` so it can import its neighbours). ``attr``
may be dotted (``module:factory.graph``) and may name a :class:`Graph` or a function that takes no
arguments and returns one. Without ``:attr`` the module's one top-level ``Graph`` is used.

Every failure is a :class:`GraphLoadError` that says which part of the reference is wrong.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import types
from pathlib import Path
from typing import Any

from cues_platform.processing.errors import GraphLoadError
from cues_platform.processing.graph import Graph

__all__ = ["GraphLoadError", "load_graph", "split_reference"]


def split_reference(reference: str) -> tuple[str, str | None]:
    """``"a.b:c"`` -> ``("a.b", "c")``; ``"C:\\x\\g.py:graph"`` keeps the drive letter."""
    text = reference.strip()
    if not text:
        raise GraphLoadError(
            "empty graph reference: pass 'package.module:attr' or 'path/to/file.py:attr'",
            reference=reference,
        )
    head, sep, tail = text.rpartition(":")
    # No colon, or the only colon is a Windows drive ("C:\\graphs\\g.py"), or a trailing ":".
    if not sep or (len(head) == 1 and tail[:1] in ("\\", "/")):
        return text, None
    if not tail:
        raise GraphLoadError(
            f"graph reference {reference!r} ends with ':'; name the attribute, e.g. {head}:graph",
            reference=reference,
        )
    return head, tail


def _is_file_reference(target: str) -> bool:
    return target.endswith(".py") or os.sep in target or "/" in target


def _import_file(target: str, reference: str) -> types.ModuleType:
    path = Path(target).expanduser()
    if not path.is_file():
        raise GraphLoadError(
            f"graph file {str(path)!r} does not exist (from reference {reference!r})",
            reference=reference,
            path=str(path),
        )
    path = path.resolve()
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = path.stem if path.stem.isidentifier() else "cues_graph_module"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise GraphLoadError(
            f"cannot load {str(path)!r} as Python (from reference {reference!r})",
            reference=reference,
        )
    module = importlib.util.module_from_spec(spec)
    previous = sys.modules.get(name)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's module: report it in one line
        if previous is not None:
            sys.modules[name] = previous
        else:
            sys.modules.pop(name, None)
        raise GraphLoadError(
            f"importing graph file {str(path)!r} failed: {type(exc).__name__}: {exc}",
            reference=reference,
        ) from exc
    return module


def _import_module(target: str, reference: str) -> types.ModuleType:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # what `python -m` does; the `cues` script does not
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and (target == exc.name or target.startswith(exc.name + ".")):
            raise GraphLoadError(
                f"no module named {target!r} (from reference {reference!r}): run from the folder "
                "that contains it, add that folder to PYTHONPATH, or pass a file path "
                "(path/to/file.py:attr)",
                reference=reference,
            ) from exc
        raise GraphLoadError(
            f"importing module {target!r} failed: {type(exc).__name__}: {exc}",
            reference=reference,
        ) from exc
    except Exception as exc:  # noqa: BLE001 - the user's module: report it in one line
        raise GraphLoadError(
            f"importing module {target!r} failed: {type(exc).__name__}: {exc}",
            reference=reference,
        ) from exc


def _resolve(module: types.ModuleType, attr: str, reference: str) -> Any:
    value: Any = module
    walked = []
    for part in attr.split("."):
        walked.append(part)
        if not hasattr(value, part):
            graphs = sorted(n for n, v in vars(module).items() if isinstance(v, Graph))
            hint = f"; graphs it defines: {', '.join(graphs)}" if graphs else ""
            raise GraphLoadError(
                f"{module.__name__!r} has no attribute {'.'.join(walked)!r} "
                f"(from reference {reference!r}){hint}",
                reference=reference,
            )
        value = getattr(value, part)
    return value


def load_graph(reference: str) -> Graph:
    """Resolve ``"package.module:attr"`` or ``"path/to/file.py:attr"`` to a :class:`Graph`."""
    target, attr = split_reference(reference)
    module = (
        _import_file(target, reference)
        if _is_file_reference(target)
        else _import_module(target, reference)
    )
    if attr is None:
        graphs = [(n, v) for n, v in vars(module).items() if isinstance(v, Graph)]
        if len(graphs) != 1:
            found = ", ".join(sorted(n for n, _ in graphs)) or "none"
            raise GraphLoadError(
                f"{reference!r} names no attribute and the module defines {len(graphs)} graphs "
                f"({found}); write {target}:<attr>",
                reference=reference,
            )
        return graphs[0][1]
    value = _resolve(module, attr, reference)
    if callable(value) and not isinstance(value, Graph):
        try:
            required = [
                p.name
                for p in inspect.signature(value).parameters.values()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
        except (TypeError, ValueError):
            required = []
        if required:
            raise GraphLoadError(
                f"{reference!r} is a function that needs arguments ({', '.join(required)}); "
                "point at a Graph or at a function that takes no arguments",
                reference=reference,
            )
        try:
            value = value()
        except Exception as exc:  # noqa: BLE001 - the user's factory: report it in one line
            raise GraphLoadError(
                f"calling {reference!r} failed: {type(exc).__name__}: {exc}", reference=reference
            ) from exc
    if not isinstance(value, Graph):
        raise GraphLoadError(
            f"{reference!r} is a {type(value).__name__}, not a cues_platform Graph "
            "(build one with Graph.build(...))",
            reference=reference,
        )
    return value
