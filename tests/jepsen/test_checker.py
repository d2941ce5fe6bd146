"""The checker catches each violation class on hand-made Delta tables (and passes a healthy one)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from cues_platform.jepsen import workload as w
from cues_platform.jepsen.checker import check_lake
from tests.jepsen.conftest import IDEM, IDEM_1, INPUTS, TXN_ABORTED, TXN_OK, rows, shape, sink_rows


def failing(hand_lake) -> dict[str, list[str]]:
    report = check_lake(hand_lake.write(), hand_lake.expectation())
    return {c.name: c.violations for c in report.checks if not c.ok}


def test_a_healthy_lake_passes_every_check(hand_lake):
    report = check_lake(hand_lake.write(), hand_lake.expectation())
    assert report.ok, report.to_dict()
    assert [c.name for c in report.checks] == ["dense_offsets", "read_committed", "acknowledged",
                                               "exactly_once", "error_rows", "sink_once", "lanes",
                                               "redeploy"]
    assert report.counts["keys_in_error_rows"] == 4 and report.counts["visible_input_keys"] == 12
    assert all(c.checked for c in report.checks)


def test_an_isolated_rejection_delivers_the_rest_of_its_batch_and_passes(hand_lake):
    hand_lake.isolated = True
    hand_lake.errors[0]["inputs"] = json.dumps({"src": [w.MERGED, "0", 9, 10]})  # REJECTED alone
    for q in (w.VALIDATED, w.LEFT, w.RIGHT, w.ENRICHED):
        hand_lake.tables[q] = rows(IDEM[:9] + TXN_OK)
    hand_lake.tables["sink"] = sink_rows(IDEM[:9] + TXN_OK)
    report = check_lake(hand_lake.write(), hand_lake.expectation())
    assert report.ok, report.to_dict()
    assert report.counts["keys_in_error_rows"] == 1


def test_an_isolating_rejection_that_took_accepted_keys_fails(hand_lake):
    hand_lake.isolated = True  # the error row still covers merged [8, 12): three accepted keys
    assert failing(hand_lake) == {"error_rows": [
        "error row at offset 0 (validate step 2, jepsen_graph.Rejected): it holds 3 key(s) the user's "
        f"rule accepts, which isolation should have delivered: {[IDEM[8], *TXN_OK]}"]}


def test_a_duplicate_key_downstream(hand_lake):
    hand_lake.tables[w.ENRICHED] = rows(IDEM[:8] + [IDEM[1]])  # offsets stay dense: 0..8
    assert failing(hand_lake) == {"exactly_once": [f"enriched: key {IDEM[1]} is there 2 times"]}


def test_a_duplicate_sink_effect(hand_lake):
    hand_lake.tables["sink"] = sink_rows(IDEM[:8] + [IDEM[0]])
    got = failing(hand_lake)
    assert got["sink_once"] == [f"sink effect of key {IDEM[0]} applied 2 times"]
    assert got["exactly_once"] == [f"sink: key {IDEM[0]} is there 2 times"]


def test_a_gap_in_offsets(hand_lake):
    hand_lake.tables[w.SRC_IDEM] = rows(IDEM, offsets=[0, 1, 2, 3, 4, 6, 7, 8, 9, 10])
    assert failing(hand_lake) == {"dense_offsets": [
        "queues/src_a partition '0': offsets are not 0..9: missing [5], out of range [10]"]}


def test_a_duplicate_offset(hand_lake):
    hand_lake.tables[w.LEFT] = rows(IDEM[:8], offsets=[0, 1, 2, 3, 4, 5, 6, 6])
    got = failing(hand_lake)["dense_offsets"]
    assert got[0] == "queues/left partition '0': duplicate offsets [6] (1 in all)"


def test_the_log_and_the_files_disagree_on_the_next_offset(hand_lake):
    root = hand_lake.write()
    write_deltalake(str(root / "queues" / w.RIGHT), rows([], offsets=[]).cast(rows(IDEM).schema),
                    mode="append", commit_properties=CommitProperties(app_transactions=[Transaction("part:0", 9)]))
    report = check_lake(root, hand_lake.expectation())
    assert report.failed() == ["dense_offsets"]
    assert report.check("dense_offsets").violations == [
        "queues/right partition '0': the log says next offset 9 but the files hold offsets up to 7"]


def test_an_aborted_transactions_row_is_processed(hand_lake):
    hand_lake.tables[w.MERGED] = rows(IDEM + TXN_OK + TXN_ABORTED)
    assert failing(hand_lake) == {"read_committed": [
        f"merged: key {TXN_ABORTED[0]} of an aborted/undecided transaction was processed"]}


def test_an_aborted_transaction_decided_committed_is_visible(hand_lake):
    hand_lake.decisions.append(("jepsen-txn#1", "committed"))
    got = failing(hand_lake)
    assert "transaction jepsen-txn#1 was decided both committed and aborted" in got["read_committed"]
    assert f"key {TXN_ABORTED[0]} of a transaction the feeder aborted is visible read_committed" in got["read_committed"]


def test_a_queue_marker_that_contradicts_the_coordinator(hand_lake):
    hand_lake.markers["jepsen-txn#1"] = 1  # the queue says committed, the coordinator aborted
    assert failing(hand_lake) == {"read_committed": [
        "queue src_t: marker of transaction jepsen-txn#1 says 1 but the coordinator says 2"]}


def test_an_error_row_for_keys_the_function_did_not_reject(hand_lake):
    hand_lake.errors.append({"processor": "validate", "step": 0, "exception_type": "jepsen_graph.Rejected",
                             "inputs": json.dumps({"src": [w.MERGED, "0", 0, 4]})})
    got = failing(hand_lake)
    assert got["error_rows"] == ["error row at offset 1 (validate step 0, jepsen_graph.Rejected): its "
                                 "input range holds no key the user's rule rejects (4 keys)"]
    assert f"validated: key {IDEM[0]} is both in an error row and delivered (1x)" in got["exactly_once"]


def test_a_platform_error_row_swallows_a_batch(hand_lake):
    hand_lake.tables[w.MERGED] = rows(IDEM[:6] + IDEM[8:] + TXN_OK)  # merge's step over src_a [6, 8) ...
    hand_lake.errors.insert(0, {"processor": "merge", "step": 1, "exception_type": "py4j.protocol.Py4JJavaError",
                                "inputs": json.dumps({"a": [w.SRC_IDEM, "0", 6, 8], "t": [w.SRC_TXN, "0", 0, 0]})})
    hand_lake.errors[1]["inputs"] = json.dumps({"src": [w.MERGED, "0", 6, 10]})  # ... went to an error row
    for q in (w.VALIDATED, w.LEFT, w.RIGHT, w.ENRICHED):
        hand_lake.tables[q] = rows(IDEM[:6])
    hand_lake.tables["sink"] = sink_rows(IDEM[:6])
    got = failing(hand_lake)
    assert got["error_rows"] == [
        "error row at offset 0 (merge step 1, py4j.protocol.Py4JJavaError): not a rejection by the "
        f"user's function; its batch of 2 key(s) is lost: {IDEM[6:8]}"]
    assert got["exactly_once"][0] == (
        f"merged: key {IDEM[6]} is there 0 times (expected once) (its batch went to the error row at "
        "offset 0 (merge step 1, py4j.protocol.Py4JJavaError))")


def test_a_missing_acknowledged_key(hand_lake):
    hand_lake.acked.add(w.idem_key(0, 10))  # acknowledged to the feeder, never stored
    assert failing(hand_lake) == {"acknowledged": [
        f"acknowledged key {w.idem_key(0, 10)} is not visible in the inputs nor in merged (lost)"]}


def test_a_key_missing_downstream(hand_lake):
    hand_lake.tables[w.ENRICHED] = rows(IDEM[:7])
    assert failing(hand_lake) == {"exactly_once": [f"enriched: key {IDEM[7]} is missing"]}


def test_a_rejected_key_delivered_instead_of_its_error_row(hand_lake):
    hand_lake.errors = []
    for q in (w.VALIDATED, w.LEFT, w.RIGHT, w.ENRICHED):
        hand_lake.tables[q] = rows(IDEM + TXN_OK)
    hand_lake.tables["sink"] = sink_rows(IDEM + TXN_OK)
    assert failing(hand_lake) == {"exactly_once": [f"key {IDEM[9]} is rejected by the user's rule but in no error row"]}


# -- two partitions, two lanes per processor ---------------------------------------------------------
def test_a_healthy_lake_over_two_partitions_passes_every_check(hand_lake):
    # the error rows cover merged/0 [8, 12) and merged/1 [6, 10): resolved by offset alone,
    # offsets 8 and 9 would name the same keys for both rows
    report = check_lake(hand_lake.add_partition_1().write(), hand_lake.expectation())
    assert report.ok, report.to_dict()
    assert report.counts["error_rows"] == 2 and report.counts["keys_in_error_rows"] == 8
    assert report.counts["visible_input_keys"] == 22 and report.counts["sink_rows"] == 14


def test_an_error_row_resolves_its_keys_in_its_own_partition(hand_lake):
    hand_lake.add_partition_1()
    hand_lake.errors[1]["inputs"] = json.dumps({"src": [w.MERGED, "1", 0, 2]})  # IDEM_1[:2], not rejected
    got = failing(hand_lake)
    assert got["error_rows"] == ["error row at offset 1 (validate.1 step 1, jepsen_graph.Rejected): its "
                                 "input range holds no key the user's rule rejects (2 keys)"]
    # the row's keys are merged/1's at offsets 0 and 1 (not merged/0's IDEM[:2])
    assert got["exactly_once"][:2] == [f"validated: key {IDEM_1[0]} is both in an error row and delivered (1x)",
                                       f"validated: key {IDEM_1[1]} is both in an error row and delivered (1x)"]


def test_a_key_in_the_other_partition(hand_lake):
    hand_lake.add_partition_1()
    hand_lake.tables[w.ENRICHED] = pa.concat_tables([rows(IDEM[:8] + [IDEM_1[0]]),
                                                     rows(IDEM_1[1:6], partition="1")])
    assert failing(hand_lake) == {"lanes": [
        f"enriched: key {IDEM_1[0]} is in partition '0' (offset 8) but its feeder sent it to partition '1'"]}


def test_a_sink_row_applied_by_the_other_lane(hand_lake):
    hand_lake.add_partition_1()
    hand_lake.tables["sink"] = pa.concat_tables([sink_rows(IDEM[:8] + [IDEM_1[0]]),
                                                 sink_rows(IDEM_1[1:6], lane="store.1")])
    assert failing(hand_lake) == {"lanes": [
        f"sink row of key {IDEM_1[0]} was applied by 'store', not by the store lane of its partition "
        "'1' ('store.1')"]}


def test_an_error_row_of_a_lane_over_another_partition(hand_lake):
    hand_lake.errors[0]["processor"] = "validate.1"  # it covers merged/0
    assert failing(hand_lake) == {"lanes": [
        "error row at offset 0 of lane 'validate.1' (partition '1'): input 'src' covers merged "
        "partition '0' [8, 12)"]}


def test_an_error_row_of_a_lane_the_graph_does_not_have(hand_lake):
    hand_lake.errors[0]["processor"] = "validate.2"
    hand_lake.errors[0]["inputs"] = json.dumps({"src": [w.MERGED, "2", 8, 12]})
    got = failing(hand_lake)
    assert got["error_rows"] == ["error row at offset 0 (validate.2 step 2, jepsen_graph.Rejected): not "
                                 "a rejection by the user's function; its batch of 0 key(s) is lost: []"]


# -- redeploys: nothing changed its meaning silently --------------------------------------------------
def test_compatible_versions_recorded_in_the_registry_pass(hand_lake):
    """Renamed bindings and merge's extra input (queue spare) are shapes of compatible versions;
    an incompatible version that was refused leaves nothing behind."""
    renamed = [shape(lane, graph="jepsen-renamed",
                     inputs=[("rows" if b == "src" else b, q, w.lane_partition(lane)) for b, q in INPUTS[
                         w.lane_family(lane)]]) for lane in w.LANES]
    extra = [shape(m, graph="jepsen-extra_input", inputs=[("a", w.SRC_IDEM, p), ("spare", w.SPARE, p),
                                                          ("t", w.SRC_TXN, p)])
             for m, p in (("merge", "0"), ("merge.1", "1"))]
    hand_lake.registry += [renamed, renamed + extra]
    hand_lake.redeploys = [{"event": "incompatible", "variant": "named_enrich", "expected": "LaneMigrationError",
                            "outcome": "refused", "error_type": "LaneMigrationError", "runner": "runner-4"},
                           {"event": "compatible", "variant": "batch"}]
    report = check_lake(hand_lake.write(), hand_lake.expectation())
    assert report.ok, report.to_dict()
    assert report.check("redeploy").checked == 1 + len(w.LANES) * 2 + 2  # one attempt, distinct rows


def test_an_incompatible_version_that_was_not_refused(hand_lake):
    hand_lake.redeploys = [{"event": "incompatible", "variant": "strategy_enrich", "expected": "StrategyChangedError",
                            "outcome": "not_refused", "decision": "accepted", "rc": None, "error_type": None,
                            "error": "", "runner": "runner-7"}]
    assert failing(hand_lake) == {"redeploy": [
        "silent change of meaning: runner-7 started incompatible version 'strategy_enrich' and it was not "
        "refused with StrategyChangedError (accepted, exit None, None: )"]}


def test_a_refusal_with_another_error_is_no_refusal_of_the_change(hand_lake):
    hand_lake.redeploys = [{"event": "incompatible", "variant": "rename_split", "expected": "ProcessorRenamedError",
                            "outcome": "refused", "decision": "exited", "rc": 2, "error_type": "LaneMigrationError",
                            "error": "processor 'split_v2' ...", "runner": "runner-3"}]
    assert list(failing(hand_lake)) == ["redeploy"]


def test_a_compatible_version_refused(hand_lake):
    hand_lake.redeploys = [{"event": "compatible_refused", "variant": "extra_input", "runner": "runner-5",
                            "error_type": "LaneMigrationError", "error": "processor 'merge' would read"}]
    assert failing(hand_lake) == {"redeploy": [
        "compatible version 'extra_input' was refused by runner-5 with LaneMigrationError: processor "
        "'merge' would read"]}


def test_an_incompatible_shape_in_an_older_registry_version_is_found(hand_lake):
    """A start under strategy_enrich that was recorded (and so ran) and a later compatible start
    that overwrote the rows: every version of the registry is read, not only the newest."""
    bad = [shape(lane, graph="jepsen-strategy_enrich", strategy="at_least_once", home=None)
           if w.lane_family(lane) == "enrich" else shape(lane) for lane in w.LANES]
    hand_lake.registry += [bad, [shape(lane) for lane in w.LANES]]
    got = failing(hand_lake)["redeploy"]
    assert got == [f"_cues/deployments version 1: processor {lane!r}: recorded by graph "
                   "'jepsen-strategy_enrich', which is not a compatible version: a start under an "
                   "incompatible version was recorded, not refused" for lane in ("enrich", "enrich.1")]


@pytest.mark.parametrize(("row", "problem"), [
    (shape("enrich", inputs=[("src", w.LEFT, "1")]),
     "reads [('left', '1')] (a lane of partition '0' reads [('left', '0')])"),
    (shape("enrich", home=w.ENRICHED_V2), "home 'enriched_v2' (its first output is 'enriched')"),
    (shape("enrich", strategy="at_least_once"), "strategy 'at_least_once'"),
    (shape("validate.1", inputs=[("src", w.MERGED, "1"), ("spare", w.SPARE, "1")]),
     "reads [('merged', '1'), ('spare', '1')] (a lane of partition '1' reads [('merged', '1')])"),
])
def test_a_shape_no_compatible_version_has_under_a_compatible_graph_name(hand_lake, row, problem):
    hand_lake.registry[0] = [r for r in hand_lake.registry[0] if r["processor"] != row["processor"]] + [row]
    assert failing(hand_lake) == {"redeploy": [
        f"_cues/deployments version 0: processor {row['processor']!r}: {problem}: a start under an "
        "incompatible version was recorded, not refused"]}


def test_a_renamed_processor_that_ran(hand_lake):
    """The backing queue of enrich_v2 and rows in enriched_v2: steps ran under incompatible versions."""
    root = hand_lake.write()
    write_deltalake(str(root / "_cues" / "backing" / "enrich_v2"), pa.table({"step": pa.array([0], pa.int64())}))
    write_deltalake(str(root / "queues" / w.ENRICHED_V2), rows(IDEM[:2]), partition_by=["_partition"])
    report = check_lake(root, hand_lake.expectation())
    assert report.failed() == ["redeploy"]
    assert report.check("redeploy").violations == [
        "backing queue 'enrich_v2': a processor id no compatible version has (something ran under an "
        "incompatible version)",
        "queue 'enriched_v2' (the home of incompatible version home_enrich) holds 2 row(s): steps ran "
        "under an incompatible version"]


def _retention_delete(root, queue: str, *, partition: str, below: int) -> None:
    """What a retention delete commits: the rows below ``below`` go, the start moves, and the
    commit metadata ``cues.retention`` says so (queues/retention.py)."""
    from deltalake import DeltaTable

    dt = DeltaTable(str(root / "queues" / queue))
    dt.delete(f"_partition = '{partition}' AND _offset < {below}", commit_properties=CommitProperties(
        app_transactions=[Transaction(f"start:{partition}", below)],
        custom_metadata={"cues.retention": json.dumps({partition: [0, below]})}))


def _retained_expectation(hand_lake, *, lagging_below: int):
    """The healthy lake's expectation as a --time run knows it: where each acknowledged key of
    src_a was sent (the feeders' AppendResult ranges) and the rows of merged partition "0" the
    lagging tailer read below ``lagging_below``."""
    import dataclasses

    e = hand_lake.expectation()
    offsets = {k: (w.SRC_IDEM, "0", i) for i, k in enumerate(IDEM)}
    read = tuple(("0", i, k) for i, k in enumerate((IDEM + TXN_OK)[:lagging_below]))
    return dataclasses.replace(e, offsets=offsets, merged_read=read)


def test_rows_retention_removed_are_proven_by_the_send_offsets_and_the_lagging_tailer(hand_lake):
    root = hand_lake.write()
    for queue in (w.SRC_IDEM, w.MERGED, w.VALIDATED, w.LEFT, w.ENRICHED):
        _retention_delete(root, queue, partition="0", below=5)
    report = check_lake(root, _retained_expectation(hand_lake, lagging_below=5))
    assert report.ok, report.to_dict()  # every key is still accounted for, once
    assert report.counts["visible_input_keys"] == 12 and report.counts["acked_keys_retained_away"] == 5
    assert report.counts["merged_rows_proven_by_the_lagging_tailer"] == 5


def test_an_acknowledged_key_at_or_above_the_start_that_is_gone_is_lost(hand_lake):
    from deltalake import DeltaTable

    root = hand_lake.write()
    _retention_delete(root, w.SRC_IDEM, partition="0", below=3)
    DeltaTable(str(root / "queues" / w.SRC_IDEM)).delete("_offset = 4")  # not retention's doing
    got = check_lake(root, _retained_expectation(hand_lake, lagging_below=0))
    assert f"acknowledged key {IDEM[4]} (sent to src_a/0 offset 4, at or above the start 3) is not there " \
           "(found None): lost" in got.check("acknowledged").violations


def test_rows_of_merged_retained_away_before_the_lagging_tailer_read_them(hand_lake):
    root = hand_lake.write()
    _retention_delete(root, w.MERGED, partition="0", below=5)
    report = check_lake(root, _retained_expectation(hand_lake, lagging_below=3))
    assert "queues/merged partition '0': retention removed offsets below 5 that the lagging tailer never " \
           "read: [3, 4] (2 in all)" in report.check("dense_offsets").violations
    assert f"merged: key {(IDEM + TXN_OK)[3]} is there 0 times (expected once)" in report.check(
        "exactly_once").violations


def test_an_acknowledged_key_retained_away_before_merge_read_it(hand_lake):
    root = hand_lake.write()
    hand_lake_e = _retained_expectation(hand_lake, lagging_below=0)
    from deltalake import DeltaTable

    DeltaTable(str(root / "queues" / w.MERGED)).delete(f"key = '{IDEM[1]}'")  # merge never had it
    _retention_delete(root, w.SRC_IDEM, partition="0", below=5)
    got = check_lake(root, hand_lake_e).check("acknowledged").violations
    assert got == [f"acknowledged key {IDEM[1]} at src_a/0 offset 1 was retained away (start 5) before "
                   "merge read it: not in merged"]


def test_rows_deleted_without_a_retention_record_are_lost(hand_lake):
    from deltalake import DeltaTable

    root = hand_lake.write()
    DeltaTable(str(root / "queues" / w.ENRICHED)).delete("_offset < 2")  # not retention's doing
    report = check_lake(root, hand_lake.expectation())
    assert report.failed() == ["dense_offsets", "exactly_once"]
    assert f"enriched: key {IDEM[0]} is missing" in report.check("exactly_once").violations
