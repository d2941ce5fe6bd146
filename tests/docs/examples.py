"""Every fenced code block of README.md and docs/*.md, and how each one is proven.

``blocks()`` finds the blocks (file, line of the opening fence, language, the heading above it).
Python blocks are keyed by ``(file, heading)``; shell blocks (bash, sh, shell, console) are cut into
commands (``$ `` prompts stripped, ``\\``-continued lines joined), each keyed by
``(file, command)``, where the command is its shell words without the trailing comment. Every key
is either in ``RUN_BY`` (the test that runs it as printed) or in ``ALLOWED`` (why it is not run);
``tests/docs/test_docs_examples.py::test_every_example_is_classified`` fails on any other, so a
new example in the docs fails CI until a test runs it (or a reviewer allows it here).
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PYTHON = frozenset({"python", "py"})
SHELL = frozenset({"bash", "sh", "shell", "console"})
# Languages that are never executed: what they hold is not code.
NOT_CODE = {
    "text": "output samples and file layouts",
    "mermaid": "diagrams (GitHub renders them)",
}

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


class DocExampleError(AssertionError):
    """A documented example is missing, ambiguous or changed (with where to look)."""


@dataclass(frozen=True)
class Block:
    file: str  # relative to the project root, e.g. "docs/auditor.md"
    line: int  # 1-based line of the opening fence
    language: str  # "" when the fence names none
    section: str  # the nearest heading above the block
    text: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Command:
    file: str
    line: int  # 1-based line where the command starts
    text: str  # as printed (continuations joined), prompt stripped: run with ``bash -c``
    key: str  # its shell words without the trailing comment

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def extract(path: Path) -> list[Block]:
    """The fenced code blocks of one Markdown file, in order."""
    rel = path.relative_to(ROOT).as_posix()
    out: list[Block] = []
    section = ""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            heading = _HEADING.match(lines[i])
            if heading:
                section = heading.group(2)
            i += 1
            continue
        marker, language, start = fence.group(2), fence.group(3).lower(), i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(marker):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise DocExampleError(f"{rel}:{start + 1}: code fence never closed")
        out.append(Block(rel, start + 1, language, section, "\n".join(body) + "\n"))
        i += 1
    return out


def blocks() -> list[Block]:
    return [b for path in doc_files() for b in extract(path)]


def command_key(text: str) -> str:
    return " ".join(shlex.split(text, comments=True))


def commands(block: Block) -> list[Command]:
    """The commands of a shell block: one per logical line, comments and blank lines skipped."""
    out: list[Command] = []
    pending: list[str] = []
    start = 0
    for n, raw in enumerate(block.text.splitlines(), start=block.line + 1):
        line = raw
        if not pending:
            start = n
            if block.language == "console":
                if not line.startswith("$ "):
                    continue  # output lines of a console sample
                line = line[2:]
        if line.rstrip().endswith("\\"):
            pending.append(line.rstrip()[:-1].rstrip())
            continue
        text = " ".join([*pending, line.strip()]).strip()
        pending = []
        if text and not text.startswith("#"):
            out.append(Command(block.file, start, text, command_key(text)))
    return out


# -- the registry ------------------------------------------------------------------------------------
README_TESTS = "tests/docs/test_readme_examples.py"
DOCS_TESTS = "tests/docs/test_docs_examples.py"
MAIN_JOB = "tests/reference/test_main_job.py"

DAGSTER_DEV = "DAGSTER_HOME=$PWD/dagster_home .venv/bin/dagster dev -h 127.0.0.1 -w workspace.yaml --log-level warning"
MATERIALIZE_DAY = ("DAGSTER_HOME=$PWD/dagster_home .venv/bin/dagster asset "
                   "materialize -f definitions.py --select settlement_report --partition 2026-11-21")
AUDIT = "cues audit --lake ./lake"
AUDIT_JSON = "cues audit --lake ./lake --json"
AUDIT_GRAPH = "cues audit --lake ./lake --graph shop/graph.py:graph"
PARTICIPANT_COMMANDS = (
    "cues participant register --lake lake --producer bank-a --consumer bank-x",
    "cues participant post --id bank-a --to bank-x --count 1000",
    "cues participant run --id bank-a --role producer --instances 3",
    "cues participant run --id bank-x --role consumer --instances 2",
    "cues participant check --id bank-a --complete",
)
OPERATING_TEST = "tests/participants/test_history.py::test_operating_commands_as_printed"
OPERATING_COMMANDS = (
    "printf batch_size = 5\\nreplay_after = 120\\n > participant.toml",  # its shell words
    "cues participant register --lake lake --producer bank-b --consumer bank-y",
    "cues participant migrate --id bank-b",
    "cues participant post --id bank-b --to bank-y --count 10 --prefix doc --config participant.toml",
    "cues participant run --id bank-b --role producer --instances 2 --config participant.toml "
    "--idle-exit 3 --no-restart",
    "cues participant status --id bank-b",
    "cues participant check --id bank-b",
    "cues participant history --id bank-b --message-id doc-00000003 --lake lake",
)

# (file, python block's heading or shell command's key) -> the test that runs it as printed
RUN_BY: dict[tuple[str, str], str] = {
    **{("docs/dagster.md", k): "tests/cli/test_quarantine.py::test_the_documented_quarantine_commands_run_as_printed"
       for k in (
           "DAGSTER_HOME=$PWD/dagster_home cues quarantine list instructions --lake ./lake",
           "DAGSTER_HOME=$PWD/dagster_home cues quarantine add instructions -p 0 --offsets 30:32 --reason "
           "typed in by hand to try the UI, not real instructions --lake ./lake",
           "DAGSTER_HOME=$PWD/dagster_home cues quarantine show instructions --lake ./lake")},
    ("README.md", "Usage"): f"{README_TESTS}::test_usage_producers_transactions_tailers",
    ("README.md", "Processors (exactly-once by default)"): f"{README_TESTS}::test_processor_example",
    ("README.md", DAGSTER_DEV): f"{DOCS_TESTS}::test_dagster_dev_serves_the_deployment",
    ("docs/reference-pipeline.md", DAGSTER_DEV): f"{DOCS_TESTS}::test_dagster_dev_serves_the_deployment",
    ("docs/reference-pipeline.md", MATERIALIZE_DAY): f"{DOCS_TESTS}::test_cues_demo_then_a_day_again",
    ("docs/reference-pipeline.md", ".venv/bin/cues demo --engine runner --messages 500"):
        f"{DOCS_TESTS}::test_cues_demo_engine_runner",
    ("docs/reference-pipeline.md", ".venv/bin/cues demo --queues --messages 20000"): f"{DOCS_TESTS}::test_cues_demo_queues",
    ("docs/jepsen.md", "cues jepsen --duration 40 --keys 1500"):
        "tests/jepsen/test_jepsen.py::test_jepsen_harness_every_check_passes",
    ("docs/dagster.md", "A graph becomes definitions"): f"{DOCS_TESTS}::test_build_definitions_example",
    ("docs/dagster.md", "Two ways to write a processor"): f"{DOCS_TESTS}::test_processor_asset_example",
    ("docs/auditor.md", "The auditor"): f"{DOCS_TESTS}::test_auditor_examples",
    ("docs/queues.md", "Retention"): f"{DOCS_TESTS}::test_retention_example",
    ("docs/auditor.md", AUDIT): f"{DOCS_TESTS}::test_auditor_examples",
    ("docs/auditor.md", AUDIT_JSON): f"{DOCS_TESTS}::test_auditor_examples",
    ("docs/auditor.md", AUDIT_GRAPH): f"{DOCS_TESTS}::test_auditor_examples",
    ("docs/benchmarks.md", ".venv/bin/python bench/bench_queues.py --quick"):
        f"{DOCS_TESTS}::test_bench_queues_quick",
    ("docs/benchmarks-pipes.md", ".venv/bin/python bench/bench_pipes.py"): f"{DOCS_TESTS}::test_bench_pipes",
    **{("docs/deployment.md", f"cues spark cluster {c}"):
       "tests/spark/test_cluster.py::test_cluster_status_and_a_second_up_or_a_taken_port_refused"
       for c in ("up", "status", "down")},  # up/down: its session fixture (tests/spark/conftest.py)
    **{("docs/deployment.md", f"cues spark connect {c}"): f"tests/spark/test_connect.py::{t}"
       for c, t in (("up", "test_status_and_a_second_up_refused"),
                    ("status", "test_status_and_a_second_up_refused"),
                    ("down", "test_down_stops_the_server_and_an_attached_process_still_exits"))},
    **{("docs/postings-protocol.md", c): f"{DOCS_TESTS}::test_participant_commands" for c in PARTICIPANT_COMMANDS},
    **{("docs/postings-protocol.md", c): OPERATING_TEST for c in OPERATING_COMMANDS},
}

# (file, key) -> why it is not executed by a test (reviewed; keep each reason true)
_RUN_SH_DEMO = (
    "installs the package into .venv with pip before it runs `.venv/bin/cues demo`: from a test it "
    "would re-install the code under test (and need the network). Its install path is the one "
    "`.ci/run` runs (`bash run.sh test`); what it runs, `.venv/bin/cues demo`, is run as printed by "
    f"{DOCS_TESTS}::test_cues_demo_then_a_day_again, and the main job itself by {MAIN_JOB}."
)
_QUIET_FULL_RUN = ("issue 26's full runs for a quiet machine (tens of minutes; they overwrite the committed "
                   "results in bench/results/): a CI machine is neither quiet nor the place to rewrite "
                   "them; their --quick modes ran end to end (docs/benchmarks.md says where).")
ALLOWED: dict[tuple[str, str], str] = {
    ("README.md", "bash run.sh demo"): _RUN_SH_DEMO,
    ("docs/reference-pipeline.md", "bash run.sh demo"): _RUN_SH_DEMO,
    ("README.md", "bash run.sh test"): "it is CI itself: `.ci/run` runs exactly this command (this test "
                                       "suite included); from a test it would recurse.",
    ("docs/reference-pipeline.md", ".venv/bin/cues demo --messages 10000"):
        "the same command and code path as `.venv/bin/cues demo` (run by "
        f"{DOCS_TESTS}::test_cues_demo_then_a_day_again) at 3.3x the traffic; only the size differs "
        "(several minutes on 2 busy cores).",
    ("docs/benchmarks.md", ".venv/bin/python bench/bench_queues.py"):
        "the full benchmark (~3 min on a quiet machine, longer when busy) overwrites the committed "
        "measurements in bench/results/queues.json; the same script at small sizes runs as printed in "
        f"{DOCS_TESTS}::test_bench_queues_quick.",
    **{("docs/benchmarks.md", cmd): _QUIET_FULL_RUN for cmd in (
        ".venv/bin/python bench/bench_driver_memory.py --note quiet machine",
        ".venv/bin/python bench/bench_participants.py --postings 10000 --paced-postings 1500 --rate 300 "
        "--note quiet machine",
        ".venv/bin/python bench/bench_peers.py --note quiet machine, run 1",
        ".venv/bin/python bench/bench_peers.py --note quiet machine, run 2 --out bench/results/peers-2.json",
    )},
}


def python_block(file: str, section: str) -> Block:
    """The one python block under ``section`` of ``file`` (as the docs print it today)."""
    found = [b for b in extract(ROOT / file) if b.language in PYTHON and b.section == section]
    if len(found) != 1:
        raise DocExampleError(f"{file}: expected one python block under '{section}', found {len(found)}; "
                              "update tests/docs/examples.py and the test that runs it")
    return found[0]


def command(file: str, key: str) -> Command:
    """The command of ``file`` whose shell words (without comment) are ``key``."""
    found = [c for b in extract(ROOT / file) if b.language in SHELL for c in commands(b) if c.key == key]
    if len(found) != 1:
        raise DocExampleError(f"{file}: expected the command {key!r} once, found {len(found)}; "
                              "update tests/docs/examples.py and the test that runs it")
    return found[0]


def keys(block: Block) -> list[str]:
    """The registry keys of a block: its heading (python), its commands (shell), none otherwise."""
    if block.language in PYTHON:
        return [block.section]
    if block.language in SHELL:
        return [c.key for c in commands(block)]
    return []


def function_source(node_id: str) -> str:
    """Source (decorators included) of the test function ``path::name``, read with ``ast``."""
    path, _, name = node_id.partition("::")
    source = (ROOT / path).read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            parts = [ast.get_source_segment(source, d) or "" for d in node.decorator_list]
            return "\n".join([*parts, ast.get_source_segment(source, node) or ""])
    raise DocExampleError(f"{node_id}: no such test function")
