"""Documentation pages generated from the code, so that they cannot drift from it.

    python -m cues_platform.devtools.pages --write   # rewrite the generated pages and blocks
    python -m cues_platform.devtools.pages --check   # exit 1 naming each page that is stale

* docs/app-transactions.md, whole, from the registry in ``queues/layout.py``;
* the import-graph picture in docs/architecture.md, between ``<!-- import-graph -->`` markers,
  from :mod:`cues_platform.devtools.import_graph`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cues_platform.devtools.import_graph import edges, mermaid
from cues_platform.queues.layout import APP_IDS, TXN_RETENTION_KEY

REPO = Path(__file__).resolve().parents[2]
APP_TRANSACTIONS = REPO / "docs" / "app-transactions.md"
ARCHITECTURE = REPO / "docs" / "architecture.md"
GRAPH_BEGIN, GRAPH_END = "<!-- import-graph: generated, do not edit -->", "<!-- /import-graph -->"


def app_transactions_page() -> str:
    """The registry of app-transaction ids as a Markdown page."""
    lines = [
        "# App-transaction ids",
        "",
        "Generated from `cues_platform/queues/layout.py` by `python -m cues_platform.devtools.pages"
        " --write`; a test keeps this page equal to the code. Each id is written in the same Delta"
        " commit as the data it describes. Ids marked *expiring* carry `lastUpdated` and may be"
        f" forgotten by Delta after `{TXN_RETENTION_KEY}`; all others live as long as their table.",
        "",
        "| id | table | version means | written by | goes away |",
        "|---|---|---|---|---|",
    ]
    for a in APP_IDS:
        shown = f"`{a.prefix}{a.key}`" + (" *expiring*" if a.expiring else "")
        lines.append(f"| {shown} | {a.table} | {a.version} | {a.owner} | {a.expiry} |")
    return "\n".join(lines) + "\n"


def graph_block() -> str:
    """The packages of cues_platform, then the modules of queues/, each as a Mermaid picture."""
    found = edges()
    return (f"{GRAPH_BEGIN}\nThe packages of `cues_platform` (an arrow points at what is imported; "
            "arrows implied by others are left out):\n\n"
            f"```mermaid\n{mermaid(found)}```\n\nThe modules of `cues_platform/queues/`:\n\n"
            f"```mermaid\n{mermaid(found, 'queues')}```\n{GRAPH_END}")


def with_graph(text: str) -> str:
    """``text`` (docs/architecture.md) with its import-graph block replaced by the current one."""
    start, end = text.find(GRAPH_BEGIN), text.find(GRAPH_END)
    if start < 0 or end < start:
        raise ValueError(f"{ARCHITECTURE} has no {GRAPH_BEGIN} ... {GRAPH_END} block")
    return text[:start] + graph_block() + text[end + len(GRAPH_END):]


def stale() -> list[Path]:
    """The generated pages whose text is not what the code generates now."""
    out = []
    if not APP_TRANSACTIONS.exists() or APP_TRANSACTIONS.read_text() != app_transactions_page():
        out.append(APP_TRANSACTIONS)
    text = ARCHITECTURE.read_text()
    if with_graph(text) != text:
        out.append(ARCHITECTURE)
    return out


def write() -> None:
    APP_TRANSACTIONS.write_text(app_transactions_page())
    ARCHITECTURE.write_text(with_graph(ARCHITECTURE.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the documentation generated from the code")
    parser.add_argument("--write", action="store_true", help="rewrite the generated pages")
    args = parser.parse_args(argv)
    if args.write:
        write()
        return 0
    for path in stale():
        print(f"{path} is stale: run python -m cues_platform.devtools.pages --write")
    return 1 if stale() else 0


if __name__ == "__main__":
    raise SystemExit(main())
