"""The replay job (issue 27, item 3, the Dagster face): after the fix, the error rows' input rows
are delivered once by ``{graph}__replay_errors``; running it again delivers nothing; a row that
cannot be read again fails the run with the report's message."""

from __future__ import annotations

from dataclasses import replace

from dagster import AssetKey, DagsterEventType, materialize

from cues_platform.dagster.replay_job import replay_job_name, replay_op_name
from cues_platform.processing import Graph, In, Kind, Options, Out, Processor, Strategy
from cues_platform.processing.runner import create_queues
from cues_platform.queues import Lake
from tests.dagster.conftest import assets_of, resources_of
from tests.dagster.test_error_rows_metadata import observation, poison_defs, poison_graph
from tests.support import rows

POISON = (13, 57)


def _ids(lake: Lake) -> list[int]:
    return sorted(lake.queue("b").read_arrow(partition="0")["id"].to_pylist())


def _failed_run(lake: Lake, lake_resource, instance, graph: Graph) -> None:
    """100 rows of which the function fails on 13 and 57: 98 delivered, 2 error rows."""
    defs = poison_defs(graph, lake_resource, list(POISON))
    create_queues(graph, lake)
    lake.queue("a").append(rows(0, 100), partition="0")
    assert materialize(assets_of(defs), resources=resources_of(defs), instance=instance,
                       selection=[AssetKey("b")]).success
    assert _ids(lake) == [i for i in range(100) if i not in POISON]


def _replay_job(graph: Graph, lake_resource, poison: list[int]):
    """The job ``build_definitions`` lists, with the deployment's resources, the ``poison`` user
    resource now ``poison``."""
    return poison_defs(graph, lake_resource, poison).resolve_job_def(replay_job_name(graph))


def _run(job, graph: Graph, instance, **config):
    return job.execute_in_process(run_config={"ops": {replay_op_name(graph): {"config": config}}},
                                  instance=instance, raise_on_error=False)


def _output(result, graph: Graph) -> dict:
    (out,) = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_OUTPUT]
    return {k: v.value for k, v in out.event_specific_data.metadata.items()}


def test_the_job_replays_each_fixed_row_once_and_again_does_nothing(lake, lake_resource, instance) -> None:
    graph = poison_graph()
    _failed_run(lake, lake_resource, instance, graph)
    job = _replay_job(graph, lake_resource, [])  # the fix: the function's data no longer poisons
    first = _run(job, graph, instance, processor="p")
    assert first.success
    meta = _output(first, graph)
    assert (meta["cues/selected"], meta["cues/replayed"], meta["cues/failed_again"],
            meta["cues/already_replayed"], meta["cues/unavailable"]) == (2, 2, 0, 0, 0)
    assert [s["step"] for s in meta["cues/replay_steps"]] == [1, 2]
    assert _ids(lake) == list(range(100))  # 13 and 57 delivered, once
    seen = observation(first)  # the error queue asset, after the replay
    assert (seen["cues/pending_rows"], seen["cues/replayed_rows"], seen["cues/not_replayable_rows"]) == (0, 2, 0)
    assert seen["dagster/row_count"] == 2  # the error rows stay: the replay log says they were replayed
    assert "| errors/0@1 | yes | p |" in seen["cues/newest_rows"]

    again = _run(job, graph, instance, processor="p")
    assert again.success
    meta = _output(again, graph)
    assert (meta["cues/selected"], meta["cues/replayed"], meta["cues/already_replayed"]) == (2, 0, 2)
    assert "cues/replay_steps" not in meta
    assert _ids(lake) == list(range(100))
    assert lake.queue("errors").count() == 2


def test_where_and_dry_run_choose_without_delivering(lake, lake_resource, instance) -> None:
    graph = poison_graph()
    _failed_run(lake, lake_resource, instance, graph)
    job = _replay_job(graph, lake_resource, [])
    dry = _run(job, graph, instance, processor="p", dry_run=True)
    assert dry.success
    meta = _output(dry, graph)
    assert (meta["cues/dry_run"], meta["cues/selected"], meta["cues/pending"], meta["cues/replayed"]) == (
        True, 2, 2, 0)
    assert _ids(lake) == [i for i in range(100) if i not in POISON]
    one = _run(job, graph, instance, processor="p", where="""payload LIKE '%"id": 57%'""")
    assert one.success and _output(one, graph)["cues/replayed"] == 1
    assert _ids(lake) == [i for i in range(100) if i != 13]
    assert (observation(one)["cues/pending_rows"], observation(one)["cues/replayed_rows"]) == (1, 1)


def test_rows_that_cannot_be_read_again_fail_the_run_with_the_reports_message(
        lake, lake_resource, instance) -> None:
    graph = poison_graph()
    _failed_run(lake, lake_resource, instance, graph)
    # a redeploy: p now reads partition 1 of a; the error rows name partition 0
    queues = [replace(q, partitions=("0", "1")) if q.name == "a" else q for q in graph.queues.values()]
    moved = Graph.build(name=graph.name, queues=queues, error_queue="errors",
                        processors=[Processor("p", Kind.MAP, graph.processors["p"].fn, {"src": In("a", "1")},
                                              {"out": Out("b", "0")})])
    lake.queue("a").add_partitions(["1"])
    result = _run(_replay_job(moved, lake_resource, []), moved, instance, processor="p")
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    data = failure.event_specific_data
    assert data.user_failure_data is not None
    text = data.user_failure_data.description
    assert "2 unavailable" in text and "errors/0@0" in text and "redeployed" in text
    assert {k: v.value for k, v in data.user_failure_data.metadata.items()}["cues/unavailable"] == 2
    assert _ids(lake) == [i for i in range(100) if i not in POISON]  # nothing delivered


def test_a_processor_replay_refuses_fails_the_run_before_anything(lake, lake_resource, instance) -> None:
    """An at_least_once processor has no replay log: the run fails with the typed refusal and
    its message; nothing is read or written."""
    graph = poison_graph()
    careless = Graph.build(name=graph.name, queues=list(graph.queues.values()), error_queue="errors",
                           processors=[replace(graph.processors["p"],
                                               options=Options(strategy=Strategy.AT_LEAST_ONCE))])
    create_queues(careless, lake)
    result = _run(_replay_job(careless, lake_resource, []), careless, instance, processor="p")
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    error = failure.event_specific_data.error
    while error.cls_name != "ReplayRefusedError" and error.cause is not None:
        error = error.cause
    assert error.cls_name == "ReplayRefusedError" and "at_least_once" in error.message
    assert lake.queue("b").count() == 0 and lake.queue("errors").count() == 0
