"""The daily settlement report: each participant's net position per value date.

From the OK rows of ``results`` for one value date: per participant, what it sent (as debtor's
bank) and received (as creditor's bank), counts and EUR amounts, and the net position
``received - sent`` (the positions of a day sum to zero). A pure function of the results, so
recomputing a day (a rerun of a failed partition) gives the same report; late postings for an
earlier value date change that day's report when it is recomputed.
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cues_platform.reference import model as m

REPORT = pa.schema([
    pa.field("value_date", pa.date32(), False), pa.field("participant", pa.string(), False),
    pa.field("sent_count", pa.int64(), False), pa.field("sent_amount", m.MONEY, False),
    pa.field("received_count", pa.int64(), False), pa.field("received_amount", m.MONEY, False),
    pa.field("net_position", m.MONEY, False),
])


def read_results(lake: Any, *, columns: list[str] | None = None) -> pa.Table:
    """Every committed row of ``results`` (all subjects) as Arrow."""
    q = lake.queue("results")
    cols = columns or ["sender", "receiver", "status", "reason", "settlement_amount", "value_date"]
    return pa.concat_tables([q.read_arrow(partition=p, columns=cols) for p in q.partitions])


def settlement_report(results: Any, day: date, *, participants: tuple[str, ...] = m.PARTICIPANTS) -> pa.Table:
    """The report of ``day`` from ``results`` (Arrow table or Spark DataFrame of RESULTS rows)."""
    if hasattr(results, "toArrow"):  # Spark: filter there, collect one day
        from pyspark.sql import functions as F

        results = results.where((F.col("status") == m.OK) & (F.col("value_date") == F.lit(day))).select(
            "sender", "receiver", "settlement_amount", "value_date", "status").toArrow()
    ok = results.filter(pc.and_(pc.equal(results["status"], m.OK),
                                pc.equal(results["value_date"], pa.scalar(day, pa.date32()))))
    rows = []
    zero = Decimal("0.00")
    sent = {p: [0, zero] for p in participants}
    received = {p: [0, zero] for p in participants}
    for s, r, amount in zip(ok["sender"].to_pylist(), ok["receiver"].to_pylist(),
                            ok["settlement_amount"].to_pylist(), strict=True):
        sent.setdefault(s, [0, zero])
        received.setdefault(r, [0, zero])
        sent[s][0] += 1
        sent[s][1] += amount
        received[r][0] += 1
        received[r][1] += amount
    for p in sorted(set(sent) | set(received)):
        rows.append({"value_date": day, "participant": p, "sent_count": sent[p][0], "sent_amount": sent[p][1],
                     "received_count": received[p][0], "received_amount": received[p][1],
                     "net_position": received[p][1] - sent[p][1]})
    return pa.Table.from_pylist(rows, schema=REPORT)
