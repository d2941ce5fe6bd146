"""Graph validation: every mistake raises GraphError naming the processor and the binding."""

from __future__ import annotations

import pytest

from cues_platform.processing import (
    ERROR_SCHEMA,
    Graph,
    GraphError,
    In,
    Kind,
    Options,
    Out,
    Processor,
    QueueDef,
)
from tests.support import PAYLOAD


def fn(ctx, **frames):
    return None


QUEUES = [QueueDef(n, PAYLOAD) for n in ("a", "b", "c", "d")] + [
    QueueDef("parts", PAYLOAD, partitions=("x", "y")), QueueDef("errors", ERROR_SCHEMA)]


def graph(*processors: Processor, queues=QUEUES, **kwargs) -> Graph:
    return Graph.build(name="g", queues=queues, processors=list(processors), **kwargs)


def test_a_valid_graph_and_its_mermaid():
    g = graph(
        Processor("src", Kind.SOURCE, fn, {}, {"out": Out("a")}),
        Processor("m", Kind.MAP, fn, {"in": In("a")}, {"out": Out("b")}),
        Processor("j", Kind.JOIN, fn, {"l": In("a"), "r": In("b")}, {"out": Out("c")}),
        Processor("f", Kind.FORK, fn, {"in": In("c")}, {"x": Out("parts", "x"), "y": Out("parts", "y")}),
        Processor("s", Kind.SINK, fn, {"in": In("parts", "x")}, {}),
        Processor("alt", Kind.ALTS, fn, {"l": In("parts", "y"), "r": In("b")}, {"out": Out("d")}),
        error_queue="errors",
    )
    order = g.topological_order()
    assert order.index("src") < order.index("m") < order.index("j") < order.index("f")
    assert order.index("f") < order.index("s") and order.index("f") < order.index("alt")
    text = g.mermaid()
    assert text.startswith("flowchart LR")
    for q in g.queues:
        assert f"q_{q}[({q})]" in text
    for p in g.processors.values():
        assert f"p_{p.id}[{p.id}<br/><i>{p.kind.value}, {p.strategy.value}</i>]" in text
        assert f"p_{p.id} -.->|errors| q_errors" in text
    assert "q_a -->|l| p_j" in text and "p_f -->|y| q_parts" in text


def expect(match: str, processor: str, binding: str | None, *processors: Processor, **kw):
    with pytest.raises(GraphError, match=match) as info:
        graph(*processors, **kw)
    assert info.value.processor == processor
    assert f"processor {processor!r}" in str(info.value)
    if binding is not None:
        assert info.value.binding == binding and repr(binding) in str(info.value)
    return info.value


def test_unknown_input_queue():
    expect("unknown queue 'nope'", "m", "in", Processor("m", Kind.MAP, fn, {"in": In("nope")}, {"out": Out("b")}))


def test_unknown_output_queue():
    expect("unknown queue 'nope'", "m", "out", Processor("m", Kind.MAP, fn, {"in": In("a")}, {"out": Out("nope")}))


@pytest.mark.parametrize(("kind", "inputs", "outputs", "what"), [
    (Kind.MAP, {"i": In("a"), "j": In("c")}, {"o": Out("b")}, "2 input binding"),
    (Kind.MAP, {}, {"o": Out("b")}, "0 input binding"),
    (Kind.MAP, {"i": In("a")}, {"o": Out("b"), "p": Out("d")}, "2 output binding"),
    (Kind.JOIN, {"i": In("a")}, {"o": Out("b")}, "1 input binding"),
    (Kind.ALTS, {"i": In("a")}, {"o": Out("b")}, "1 input binding"),
    (Kind.JOIN, {"i": In("a"), "j": In("c")}, {}, "0 output binding"),
    (Kind.FORK, {"i": In("a")}, {"o": Out("b")}, "1 output binding"),
    (Kind.SINK, {"i": In("a")}, {"o": Out("b")}, "1 output binding"),
    (Kind.SINK, {}, {}, "0 input binding"),
    (Kind.SOURCE, {"i": In("a")}, {"o": Out("b")}, "1 input binding"),
    (Kind.SOURCE, {}, {}, "0 output binding"),
])
def test_binding_count_per_kind(kind, inputs, outputs, what):
    err = expect(what, "p", None, Processor("p", kind, fn, inputs, outputs))
    assert kind.value in str(err)


def test_an_output_queue_with_two_writers():
    expect("already writes", "m2", "out",
           Processor("m1", Kind.MAP, fn, {"in": In("a")}, {"out": Out("b")}),
           Processor("m2", Kind.MAP, fn, {"in": In("c")}, {"out": Out("b")}))


def test_two_writers_of_one_queue_routed_by_column():
    expect("already writes", "m2", "out",
           Processor("m1", Kind.MAP, fn, {"in": In("a")}, {"out": Out("parts", partition_column="note")}),
           Processor("m2", Kind.MAP, fn, {"in": In("c")}, {"out": Out("parts", "x")}))


def test_a_cycle():
    with pytest.raises(GraphError, match="cycle") as info:
        graph(Processor("m1", Kind.MAP, fn, {"in": In("a")}, {"out": Out("b")}),
              Processor("m2", Kind.MAP, fn, {"in": In("b")}, {"out": Out("a")}))
    assert info.value.processor in ("m1", "m2")
    assert "m1" in str(info.value) and "m2" in str(info.value)


def test_a_self_loop():
    with pytest.raises(GraphError, match="cycle: m -> m"):
        graph(Processor("m", Kind.MAP, fn, {"in": In("a")}, {"out": Out("a")}))


def test_unknown_input_partition():
    expect("partition 'z'", "m", "in", Processor("m", Kind.MAP, fn, {"in": In("parts", "z")}, {"out": Out("b")}))


def test_unknown_output_partition():
    expect("partition 'z'", "m", "out", Processor("m", Kind.MAP, fn, {"in": In("a")}, {"out": Out("parts", "z")}))


def test_unknown_partition_column():
    expect("column 'nope'", "m", "out",
           Processor("m", Kind.MAP, fn, {"in": In("a")}, {"out": Out("parts", partition_column="nope")}))


def test_unknown_error_queue():
    with pytest.raises(GraphError, match="error queue 'nope'"):
        graph(Processor("m", Kind.MAP, fn, {"in": In("a")}, {"out": Out("b")}), error_queue="nope")
    expect("error queue 'nope'", "m", None,
           Processor("m", Kind.MAP, fn, {"in": In("a")}, {"out": Out("b")}, error_queue="nope"))


def test_duplicates_and_batch_size():
    with pytest.raises(GraphError, match="declared twice"):
        graph(queues=[QueueDef("a", PAYLOAD), QueueDef("a", PAYLOAD)])
    with pytest.raises(GraphError, match="used twice"):
        graph(Processor("m", Kind.MAP, fn, {"in": In("a")}, {"out": Out("b")}),
              Processor("m", Kind.MAP, fn, {"in": In("c")}, {"out": Out("d")}))
    expect("batch_size", "m", None,
           Processor("m", Kind.MAP, fn, {"in": In("a")}, {"out": Out("b")}, options=Options(batch_size=0)))
