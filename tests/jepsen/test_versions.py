"""Every version of the harness's graph (``workload.VARIANTS``) against a lake the base graph ran:
each incompatible one refused with its class before any step, each compatible one continued (after
a sink's step in flight, "renamed" deferred with StepInFlightError until the version that began the
step, which the nemesis reads from the error, finished it), and the harness's own checker (its
``redeploy`` check included) finds every key once.

In one process, with one Spark session: a harness run with ``--redeploy`` (test_jepsen.py) meets
only the versions its seed picks, so this is where each version's claim is proved once."""

from __future__ import annotations

import pytest

from cues_platform.jepsen import workload as w
from cues_platform.jepsen.checker import Expectation, check_lake
from cues_platform.jepsen.nemesis import recorder_of
from cues_platform.processing import GraphRunner
from cues_platform.processing import errors as processing_errors
from cues_platform.queues import Lake

REJECTED_KEY = w.idem_key(0, 500)  # the user's rule rejects it: its batch becomes an error row


def crash_after_snapshot(point: str) -> None:
    if point == "after_snapshot":
        raise KeyboardInterrupt  # a crash, not a handled error


def test_every_incompatible_version_is_refused_and_every_compatible_one_continues(spark, tmp_path):
    from cues_platform.jepsen.user.jepsen_graph import build

    lake = Lake(root=str(tmp_path / "lake"))
    partition_of: dict[str, str] = {}

    def feed(round_: int) -> None:
        """Two batches of idempotent feeder 0's keys, one per partition (as the feeders place them)."""
        for b in (2 * round_, 2 * round_ + 1):
            keys = [w.idem_key(0, 10 * b + j) for j in range(10)]
            if round_ == 2 and b % 2 == 0:
                keys.append(REJECTED_KEY)
            part = w.idem_partition(0, b)
            lake.queue(w.SRC_IDEM).append(w.batch_table(keys), partition=part)
            partition_of.update(dict.fromkeys(keys, part))

    def outputs() -> dict[str, int]:
        return {q: lake.queue(q).version() for q in (w.MERGED, w.VALIDATED, w.LEFT, w.RIGHT, w.ENRICHED, w.ERRORS)}

    GraphRunner(graph=build(), lake=lake, spark=spark)  # creates the queues
    feed(0)
    GraphRunner(graph=build(), lake=lake, spark=spark).run_until_idle()
    for variant in w.INCOMPATIBLE:
        before = outputs()
        error = getattr(processing_errors, variant.refusal)
        with pytest.raises(error, match=r"Ways out: .*cues processor forget") as info:
            GraphRunner(graph=build(variant.name), lake=lake, spark=spark)
        assert type(info.value) is error, (variant.name, type(info.value))
        assert outputs() == before, f"{variant.name} was refused, but only after writing"
    # A sink records its snapshot before its function: crashed there (store's lanes only), the
    # step must be finished with the bindings it began with, so "renamed" is deferred, and the
    # nemesis reads from the error which version began it.
    feed(1)
    GraphRunner(graph=build(), lake=lake, spark=spark, only=["merge", "validate", "split", "enrich"]).run_until_idle()
    with pytest.raises(KeyboardInterrupt):
        GraphRunner(graph=build(), lake=lake, spark=spark, only=["store"], hook=crash_after_snapshot).run_until_idle()
    with pytest.raises(processing_errors.StepInFlightError) as info:
        GraphRunner(graph=build("renamed"), lake=lake, spark=spark).run_until_idle()
    assert recorder_of(str(info.value).splitlines()[0][:300]) == "base"  # as the `failed` event carries it
    GraphRunner(graph=build(), lake=lake, spark=spark).run_until_idle()  # finishes the step
    for round_, variant in enumerate(("renamed", "extra_input", "batch", "base"), start=2):
        feed(round_)
        GraphRunner(graph=build(variant), lake=lake, spark=spark).run_until_idle()
    keys = frozenset(partition_of)
    report = check_lake(lake.root, Expectation(acked=keys, aborted_keys=frozenset(), known_keys=keys,
                                               partition_of=partition_of))
    assert report.ok, report.to_dict()
    assert report.counts["visible_input_keys"] == len(keys) == 121 and report.counts["error_rows"] == 1
    assert report.counts["sink_rows"] == len(keys) - report.counts["keys_in_error_rows"]
    # the registry holds each compatible version's shapes, none of an incompatible one (check 8)
    assert report.check("redeploy").checked >= len(w.LANES) * 3
