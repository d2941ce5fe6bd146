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
