"""``cues errors list``: an error queue in words, one row per failing input row (isolation)."""

from __future__ import annotations

import json

import pyarrow as pa
from click.testing import CliRunner
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from cues_platform.cli import main
from cues_platform.processing import (
    ERROR_SCHEMA,
    Graph,
    GraphRunner,
    In,
    Kind,
    Options,
    Out,
    Processor,
    QueueDef,
)
from cues_platform.queues import Lake
from tests.support import PAYLOAD, rows


class Poison(ValueError):
    """Raised by the UDF on a poison id."""


def _run_with_poison(spark, lake: Lake, poison: set[int]) -> None:
    def check(i: int) -> int:
        if i in poison:
            raise Poison(f"poison id {i}")
        return i

    udf = F.udf(check, LongType())

    def clean(ctx, src):
        return src.select(udf(F.col("id")).alias("id"), F.col("note"))

    graph = Graph.build(name="g", queues=[QueueDef("a", PAYLOAD), QueueDef("b", PAYLOAD),
                                           QueueDef("errors", ERROR_SCHEMA)],
                        processors=[Processor("clean", Kind.MAP, clean, {"src": In("a", "0")},
                                              {"out": Out("b", "0")}, options=Options(batch_size=100))],
                        error_queue="errors")
    GraphRunner(graph=graph, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 20), partition="0")
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()


def test_errors_list_names_each_failing_row_its_exception_and_payload(spark, lake) -> None:
    _run_with_poison(spark, lake, {3, 7})
    cli = CliRunner()
    shown = cli.invoke(main, ["errors", "list", "--lake", lake.root])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert len(lines) == 2
    for n, (line, offset) in enumerate(zip(lines, (3, 7), strict=True)):
        assert line.startswith(f"errors/0@{n}  clean step 0  failed on a/0@{offset}  ")
        assert f"Poison: poison id {offset}  " in line and line.endswith(f'row {{"id": {offset}, "note": "n{offset}"}}')

    as_json = cli.invoke(main, ["errors", "list", "--json", "--lake", lake.root])
    assert as_json.exit_code == 0, as_json.output
    parsed = [json.loads(line) for line in as_json.output.splitlines()]
    assert [r["inputs"] for r in parsed] == [{"src": ["a", "0", 3, 4]}, {"src": ["a", "0", 7, 8]}]
    assert [json.loads(r["payload"]) for r in parsed] == [{"id": 3, "note": "n3"}, {"id": 7, "note": "n7"}]
    assert all(r["exception_type"].endswith("Poison") for r in parsed)

    last = cli.invoke(main, ["errors", "list", "-n", "1", "--json", "--lake", lake.root])
    assert [json.loads(line)["inputs"]["src"][2] for line in last.output.splitlines()] == [7]
    other = cli.invoke(main, ["errors", "list", "--processor", "nobody", "--lake", lake.root])
    assert other.exit_code == 0 and "no error rows of processor 'nobody'" in other.output


def test_errors_list_refuses_what_is_not_an_error_queue_in_one_line(lake) -> None:
    lake.create_queue("plain", schema=pa.schema([pa.field("id", pa.int64())]))
    cli = CliRunner()
    plain = cli.invoke(main, ["errors", "list", "plain", "--lake", lake.root])
    assert plain.exit_code == 2
    assert "queue 'plain' is not an error queue" in plain.output and "error_queue" in plain.output
    missing = cli.invoke(main, ["errors", "list", "nope", "--lake", lake.root])
    assert missing.exit_code == 2 and "nope" in missing.output and "Traceback" not in missing.output
    negative = cli.invoke(main, ["errors", "list", "plain", "-n", "-1", "--lake", lake.root])
    assert negative.exit_code == 2 and "-n -1" in negative.output


GRAPH_FILE = '''
import json
from pathlib import Path

from cues_platform.processing import ERROR_SCHEMA, Graph, In, Kind, Out, Processor, QueueDef
from tests.support import PAYLOAD

POISON = Path(__file__).with_name("poison.json")


def clean(ctx, src):
    ids = set(src.select("id").toArrow()["id"].to_pylist())
    bad = ids & set(json.loads(POISON.read_text()))
    if bad:
        raise ValueError(f"poison ids {sorted(bad)}")
    return src


graph = Graph.build(name="g", queues=[QueueDef("a", PAYLOAD), QueueDef("b", PAYLOAD),
                                      QueueDef("errors", ERROR_SCHEMA)],
                    processors=[Processor("clean", Kind.MAP, clean, {"src": In("a", "0")},
                                          {"out": Out("b", "0")})],
                    error_queue="errors")
'''


def test_errors_replay_after_the_fix_delivers_the_rows_once_and_again_does_nothing(spark, lake, tmp_path) -> None:
    from cues_platform.processing.loader import load_graph

    (tmp_path / "poison.json").write_text("[3, 7]")
    (tmp_path / "graph_file.py").write_text(GRAPH_FILE)
    ref = f"{tmp_path / 'graph_file.py'}:graph"
    graph = load_graph(ref)
    GraphRunner(graph=graph, lake=lake, spark=spark)
    lake.queue("a").append(rows(0, 20), partition="0")
    GraphRunner(graph=graph, lake=lake, spark=spark).run_until_idle()
    assert sorted(lake.queue("b").read_arrow(partition="0")["id"].to_pylist()) == [
        i for i in range(20) if i not in (3, 7)]

    cli = CliRunner()
    (tmp_path / "poison.json").write_text("[]")  # the fix
    dry = cli.invoke(main, ["errors", "replay", ref, "--processor", "clean", "--dry-run", "--lake", lake.root])
    assert dry.exit_code == 0, dry.output
    assert "2 error row(s) of 'errors' selected, would replay 2" in dry.output
    done = cli.invoke(main, ["errors", "replay", ref, "--processor", "clean", "--where", "payload LIKE '%\"id\": 3,%'",
                             "--lake", lake.root])
    assert done.exit_code == 0, done.output
    assert "1 error row(s) of 'errors' selected, replayed 1, 1 delivered, 0 failed again (new error rows)" \
        in done.output
    listed = cli.invoke(main, ["errors", "list", "--lake", lake.root]).output.splitlines()
    assert [line.endswith("[replayed]") for line in listed] == [True, False]
    pending = cli.invoke(main, ["errors", "list", "--pending", "--lake", lake.root]).output.splitlines()
    assert len(pending) == 1 and pending[0].startswith("errors/0@1  clean step 0  failed on a/0@7")
    rest = cli.invoke(main, ["errors", "replay", ref, "--processor", "clean", "--lake", lake.root])
    assert "2 error row(s) of 'errors' selected, replayed 1, 1 delivered, 0 failed again (new error rows), " \
        "1 replayed before (skipped)" in rest.output, rest.output
    again = cli.invoke(main, ["errors", "replay", ref, "--processor", "clean", "--lake", lake.root])
    assert "replayed 0, 0 delivered, 0 failed again (new error rows), 2 replayed before (skipped)" \
        in again.output
    assert sorted(lake.queue("b").read_arrow(partition="0")["id"].to_pylist()) == list(range(20))
    none = cli.invoke(main, ["errors", "list", "--pending", "--lake", lake.root])
    assert none.output.strip() == "errors: no pending error rows"
    bad = cli.invoke(main, ["errors", "replay", ref, "--processor", "clean", "--where", "nope = 1",
                            "--lake", lake.root])
    assert bad.exit_code == 2 and "--where 'nope = 1' is not a Spark SQL condition" in bad.output
