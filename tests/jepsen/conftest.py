"""Hand-made lakes for the checker's own tests: real Delta tables written with deltalake."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from cues_platform.jepsen import workload as w
from cues_platform.jepsen.checker import Expectation

IDEM = [w.idem_key(0, j) for j in range(10)]
TXN_OK = [w.txn_key(0, 0), w.txn_key(0, 1)]  # transaction jepsen-txn#0, committed
TXN_ABORTED = [w.txn_key(1, 0)]  # transaction jepsen-txn#1, aborted on purpose
REJECTED = IDEM[9]  # the one key the hand-made rule rejects
IDEM_1 = [w.idem_key(1, j) for j in range(10)]  # partition "1" (HandLake.add_partition_1)
REJECTED_1 = IDEM_1[9]


REGISTRY_SCHEMA = pa.schema([(c, pa.string()) for c in ("processor", "family", "strategy", "home",
                                                          "inputs", "graph")])
FIRST_OUTPUTS = {"merge": w.MERGED, "validate": w.VALIDATED, "split": w.LEFT, "enrich": w.ENRICHED}
INPUTS = {"merge": [("a", w.SRC_IDEM), ("t", w.SRC_TXN)], "validate": [("src", w.MERGED)],
          "split": [("src", w.VALIDATED)], "enrich": [("src", w.LEFT)], "store": [("src", w.RIGHT)]}


def shape(lane: str, *, graph: str = "jepsen", strategy: str = "exactly_once",
          inputs: list[tuple[str, str, str]] | None = None, home: str | None = "") -> dict:
    """A registry row (``_cues/deployments``) of ``lane`` as the base graph records it; the
    keywords change one thing."""
    family, part = w.lane_family(lane), w.lane_partition(lane)
    inputs = inputs if inputs is not None else [(b, q, part) for b, q in INPUTS[family]]
    return {"processor": lane, "family": family, "strategy": strategy,
            "home": FIRST_OUTPUTS.get(family) if home == "" else home,
            "inputs": json.dumps([list(i) for i in sorted(inputs)]), "graph": graph}


def rows(keys: list[str], *, offsets: list[int] | None = None, txn: str | None = None,
         partition: str = "0") -> pa.Table:
    offsets = list(range(len(keys))) if offsets is None else offsets
    n = len(keys)
    return pa.table({"key": pa.array(keys, pa.string()),
                     "n": pa.array([w.key_number(k) for k in keys], pa.int64()),
                     "_partition": pa.array([partition] * n, pa.string()),
                     "_offset": pa.array(offsets, pa.int64()),
                     "_txn_id": pa.array([txn] * n, pa.string())})


def sink_rows(keys: list[str], *, lane: str = "store") -> pa.Table:
    """Rows of the sink table as a store lane writes them (the delivery hash, the lane)."""
    return pa.table({"key": keys, "hash": ["ab" * 16] * len(keys), w.SINK_LANE_COLUMN: [lane] * len(keys)})


@dataclass
class HandLake:
    """A healthy lake of the harness's layout; tests change one thing and run the checker.

    src_a: IDEM (offsets 0..9); src_t: TXN_OK (txn #0) then TXN_ABORTED (txn #1, offset 2);
    merged: IDEM + TXN_OK; the error queue has one row covering merged [8, 12) (it holds
    REJECTED); validated, left, right, enriched and the sink hold IDEM[:8]. Every key is in
    partition "0" (lanes ``validate``, ``store``, ...) until :meth:`add_partition_1`."""

    root: Path
    tables: dict[str, pa.Table] = field(default_factory=dict)
    errors: list[dict] = field(default_factory=list)
    decisions: list[tuple[str, str]] = field(default_factory=list)
    markers: dict[str, int] = field(default_factory=dict)  # src_t app transactions txn:{id}
    acked: set[str] = field(default_factory=set)
    partition_of: dict[str, str] = field(default_factory=dict)  # where the feeders sent each key
    rejected: set[str] = field(default_factory=set)  # the hand-made rule
    registry: list[list[dict]] = field(default_factory=list)  # _cues/deployments, version by version
    redeploys: list[dict] = field(default_factory=list)  # the redeploy nemesis's records
    # False: the rejection takes its whole batch (the error row covers merged [8, 12), as
    # Options(on_error=whole_step) writes it); the harness's graph isolates (True)
    isolated: bool = False

    @classmethod
    def healthy(cls, root: Path) -> HandLake:
        lake = cls(root)
        lake.tables[w.SRC_IDEM] = rows(IDEM)
        lake.tables[w.SRC_TXN] = pa.concat_tables([rows(TXN_OK, txn="jepsen-txn#0"),
                                                   rows(TXN_ABORTED, offsets=[2], txn="jepsen-txn#1")])
        lake.tables[w.MERGED] = rows(IDEM + TXN_OK)
        for q in (w.VALIDATED, w.LEFT, w.RIGHT, w.ENRICHED):
            lake.tables[q] = rows(IDEM[:8])
        lake.tables["sink"] = sink_rows(IDEM[:8])
        lake.errors = [{"processor": "validate", "step": 2, "exception_type": "jepsen_graph.Rejected",
                        "inputs": json.dumps({"src": [w.MERGED, "0", 8, 12]})}]
        lake.decisions = [("jepsen-txn#0", "begin"), ("jepsen-txn#0", "committed"),
                          ("jepsen-txn#1", "begin"), ("jepsen-txn#1", "aborted")]
        lake.markers = {"jepsen-txn#0": 1, "jepsen-txn#1": 2}
        lake.acked = set(IDEM + TXN_OK)
        lake.partition_of = dict.fromkeys(IDEM + TXN_OK + TXN_ABORTED, "0")
        lake.rejected = {REJECTED}
        lake.registry = [[shape(lane) for lane in w.LANES]]
        return lake

    def add_partition_1(self) -> HandLake:
        """Partition "1" as the lanes ``merge.1`` ... ``store.1`` fill it: IDEM_1 in src_a/1 and
        merged/1 (offsets 0..9, where partition "0" holds other keys); one error row of
        ``validate.1`` covers merged/1 [6, 10) (it holds REJECTED_1; offsets 8 and 9 are also in
        the range of partition "0"'s error row); validated, left, right and enriched hold
        IDEM_1[:6] in partition "1", the sink has them from ``store.1``."""
        def both(name: str, keys: list[str]) -> None:
            self.tables[name] = pa.concat_tables([self.tables[name], rows(keys, partition="1")])

        both(w.SRC_IDEM, IDEM_1)
        both(w.MERGED, IDEM_1)
        for q in (w.VALIDATED, w.LEFT, w.RIGHT, w.ENRICHED):
            both(q, IDEM_1[:6])
        self.tables["sink"] = pa.concat_tables([self.tables["sink"], sink_rows(IDEM_1[:6], lane="store.1")])
        self.errors.append({"processor": "validate.1", "step": 1, "exception_type": "jepsen_graph.Rejected",
                            "inputs": json.dumps({"src": [w.MERGED, "1", 6, 10]})})
        self.acked |= set(IDEM_1)
        self.partition_of |= dict.fromkeys(IDEM_1, "1")
        self.rejected.add(REJECTED_1)
        return self

    def write(self) -> Path:
        for name, table in self.tables.items():
            if name == "sink":
                write_deltalake(str(self.root / w.SINK_TABLE), table)
                continue
            props = None
            if name == w.SRC_TXN:
                props = CommitProperties(app_transactions=[
                    Transaction(f"txn:{t}", v) for t, v in self.markers.items()])
            write_deltalake(str(self.root / "queues" / name), table, partition_by=["_partition"],
                            commit_properties=props)
        n = len(self.errors)
        errors = pa.table({
            "processor": [e["processor"] for e in self.errors],
            "step": pa.array([e["step"] for e in self.errors], pa.int64()),
            "inputs": [e["inputs"] for e in self.errors],
            "exception_type": [e["exception_type"] for e in self.errors],
            "_partition": ["0"] * n, "_offset": pa.array(range(n), pa.int64())},
            schema=pa.schema([("processor", pa.string()), ("step", pa.int64()), ("inputs", pa.string()),
                              ("exception_type", pa.string()), ("_partition", pa.string()),
                              ("_offset", pa.int64())]))
        write_deltalake(str(self.root / "queues" / w.ERRORS), errors, partition_by=["_partition"])
        for version in self.registry:
            write_deltalake(str(self.root / "_cues" / "deployments"), pa.Table.from_pylist(
                version, schema=REGISTRY_SCHEMA), mode="overwrite")
        write_deltalake(str(self.root / "_cues" / "transactions"), pa.table({
            "txn_id": [t for t, _ in self.decisions], "action": [a for _, a in self.decisions]}))
        return self.root

    def expectation(self) -> Expectation:
        return Expectation(acked=frozenset(self.acked), aborted_keys=frozenset(TXN_ABORTED),
                           known_keys=frozenset(self.partition_of) - set(TXN_ABORTED),
                           partition_of=dict(self.partition_of), is_rejected=self.rejected.__contains__,
                           redeploys=tuple(self.redeploys), isolated=self.isolated)


@pytest.fixture
def hand_lake(tmp_path: Path) -> HandLake:
    return HandLake.healthy(tmp_path / "lake")
