"""The plan is a pure function of the seed (so --seed replays it) and covers what the checks need."""

from __future__ import annotations

from cues_platform.jepsen import workload as w


def test_the_same_seed_gives_the_same_plan_and_another_seed_another():
    a, b, c = w.Plan(seed=5), w.Plan(seed=5), w.Plan(seed=6)
    assert a.idem_batches == b.idem_batches and a.txn_batches == b.txn_batches
    assert a.aborted_keys == b.aborted_keys
    assert (a.idem_batches, a.txn_batches) != (c.idem_batches, c.txn_batches)


def test_the_plan_has_every_key_once_some_aborted_and_some_rejected():
    plan = w.Plan(seed=11, keys=2_000)
    sent = [k for bs in plan.idem_batches for b in bs for k in b]
    sent += [k for t, b in enumerate(plan.txn_batches) if not plan.aborted(t) for k in b]
    assert len(sent) == len(set(sent)) == len(plan.all_keys) == 2_000
    assert plan.aborted_keys and not plan.aborted_keys & plan.all_keys
    assert sum(map(w.is_rejected, plan.all_keys)) >= 2


def test_each_batch_and_transaction_is_in_one_partition_and_both_partitions_get_keys():
    plan = w.Plan(seed=11, keys=2_000)
    for f, batches in enumerate(plan.idem_batches):
        for b, keys in enumerate(batches):
            assert {plan.partition_of[k] for k in keys} == {w.idem_partition(f, b)}
    for t, keys in enumerate(plan.txn_batches):
        assert {plan.partition_of[k] for k in keys} == {w.txn_partition(t)}
    assert set(plan.partition_of) == plan.all_keys | plan.aborted_keys
    for keys in (plan.all_keys, plan.aborted_keys):
        assert {plan.partition_of[k] for k in keys} == set(w.PARTITIONS)


def test_the_lanes_the_checker_names_are_the_graphs():
    # The checker and the nemesis derive lane ids from the documented rule; the platform expands
    # the user's graph into exactly those lanes, each over its own partition.
    from cues_platform.jepsen.user.jepsen_graph import graph

    assert set(w.LANES) == set(graph.processors)
    assert {f: sorted(lanes) for f, lanes in graph.families.items()} == {
        p: sorted(w.lane_id(p, part) for part in w.PARTITIONS) for p in w.PROCESSORS}
    for lane, p in graph.processors.items():
        assert {i.partition for i in p.inputs.values()} == {w.lane_partition(lane)}, lane
        assert {o.partition for o in p.outputs.values()} <= {w.lane_partition(lane)}, lane
        assert w.lane_family(lane) == p.family


def test_every_graph_version_loads_by_its_reference_with_the_bindings_the_nemesis_assumes():
    # The nemesis runs `cues run jepsen_graph.py:graph_<variant>` and, after a StepInFlightError,
    # picks the version whose bindings began the step from workload.bindings_of; the checker
    # accepts registry rows only of the compatible versions' graph names.
    from cues_platform.jepsen.nemesis import graph_ref
    from cues_platform.processing.loader import load_graph

    names = set()
    for v in w.VARIANTS.values():
        g = load_graph(graph_ref(v.name))
        names.add(g.name)
        assert g.name == v.graph_name
        got = {p.family: tuple(sorted(p.inputs)) for p in g.processors.values()}
        assert got == w.bindings_of(v.name), v.name
        if not v.compatible:
            assert v.target in w.FIRST_OUTPUT and v.refusal.endswith("Error")
        else:
            assert set(g.processors) == set(w.LANES), v.name
    assert len(names) == len(w.VARIANTS)
    assert {v.refusal for v in w.INCOMPATIBLE} == {"LaneMigrationError", "StrategyChangedError",
                                                  "ProcessorRenamedError", "HomeChangedError"}
