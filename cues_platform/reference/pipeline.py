"""The payments graph: every processor kind on realistic traffic.

```
participants ──▶ postings (subject = receiver) ──▶ intake (alts) ──▶ instructions
instructions ──▶ parse (map) ──▶ parsed ─┐
fx (source) ──▶ fx_rates ────────────────┴▶ convert (join) ──▶ priced
priced ──▶ validate (fork) ──▶ results (subject = sender), ledger_entries, malformed
ledger_entries ──▶ ledger (sink: PostgreSQL, exactly once by delivery hash)
```

Contracts (each processor is exactly-once; see docs/reference-pipeline.md):

- ``intake`` (alts) merges the subjects of ``postings`` into one clearing lane, one subject per
  step (whichever has data, round robin), adding where each instruction came from.
- ``parse`` (map) parses the JSON payload and names the first failed check in ``malformed``.
  ``intake`` and ``parse`` are declared on their functions with ``@processor_asset``; ``fx``,
  ``convert``, ``validate`` and ``ledger`` are processors with ``asset_body=AssetBody.FUNCTION``:
  in Dagster the asset body of all six is the function itself, each output handed to the
  ``cues_step_io`` IO manager (a fork's outputs committed together by the step protocol). One
  materialization is one step; ``intake`` reads every partition of ``postings`` (one lane per
  participant), so its materialization is one step of each participant's lane with new
  postings, each lane delivered through its own protocol (an idle lane commits nothing).
  ``cues run`` runs them all the same way.
- ``fx`` (source) publishes one fixing (a row per currency) when ``convert`` has instructions
  waiting (or on their way) and has used every fixing published so far (quotes on demand), so the join always
  gets a batch from both inputs and never stalls; fixing ``k`` depends only on ``k``.
- ``convert`` (join) prices each instruction at the latest fixing of its batch.
- ``validate`` (fork) routes malformed instructions to ``malformed`` and decides OK / REJECTED for
  the rest, in clearing-lane order, against its own delivered state (seen message ids, balances =
  opening balances from the ``accounts`` directory + its delivered ledger entries).
- ``ledger`` (sink) books the entries and balances in PostgreSQL in one transaction with the
  delivery hash (:func:`cues_platform.processing.sinks.postgres_once`).

``instructions`` has a data contract (:data:`INSTRUCTIONS_CONTRACT`, pandera): a posting whose
header breaks it (a negative replay counter, a last posting before the first, a participant
posting to itself) is split off inside the ``intake`` step and delivered to ``errors`` in the same
attempt, one row naming the failed checks with the row as JSON; the rest of the batch goes on.

``intake``, ``parse`` and ``convert`` are stateless: when their function raises, the step isolates
the postings it fails on (``processing/isolation.py``: one row each in ``errors``) and delivers the
rest. ``validate`` and ``ledger`` keep state, so they have no error
queue: an exception stops them and the next start retries the same batch.
"""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa

from cues_platform.processing import (
    ERROR_SCHEMA,
    AssetBody,
    Graph,
    In,
    Kind,
    Options,
    Out,
    Processor,
    QueueDef,
    processor_asset,
)
from cues_platform.processing.backing import Snapshot
from cues_platform.queues.layout import LANE_POSITION, PROCESSOR_STEP
from cues_platform.reference import model as m
from cues_platform.reference.ledger import book

GRAPH_NAME = "payments"
FIXING_EPOCH = datetime(2026, 11, 20, tzinfo=UTC)
DEFAULT_BATCH = 5_000


def instructions_contract() -> Any:
    """The contract of ``instructions`` (pandera, checked row by row inside the ``intake`` step)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pandera.pandas as pa_

    return pa_.DataFrameSchema(
        {"replays": pa_.Column(checks=pa_.Check.ge(0), name="replays")},
        checks=[
            pa_.Check(lambda df: df["last_datum"] >= df["inception_datum"], name="last_datum_not_before_inception"),
            pa_.Check(lambda df: df["sender"] != df["receiver"], name="sender_is_not_receiver"),
        ],
        strict=False, name="instructions",
    )


def business_contracts() -> dict[str, Any]:
    """``pandera.pyspark`` contracts of the queues the processors fill with business data: what a
    step must never deliver (the Dagster ``contract`` check evaluates them on the Spark frame of
    the rows each materialization wrote; bad *input* is filtered earlier, by ``instructions``'
    row-level contract and by ``parse``/``validate``). A few checks each: every check is a Spark
    job of the check."""
    import warnings

    from pyspark.sql import types as T

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pandera.pyspark as ps

    money = T.DecimalType(18, 2)
    currency = ps.Check.str_matches(r"^[A-Z]{3}$")
    return {
        "parsed": ps.DataFrameSchema({"replays": ps.Column(T.IntegerType(), ps.Check.ge(0))}, name="parsed"),
        "fx_rates": ps.DataFrameSchema({"rate": ps.Column(T.DoubleType(), ps.Check.gt(0)),
                                        "currency": ps.Column(T.StringType(), currency)}, name="fx_rates"),
        "priced": ps.DataFrameSchema({"rate": ps.Column(T.DoubleType(), ps.Check.gt(0), nullable=True)},
                                     name="priced"),
        "results": ps.DataFrameSchema({"status": ps.Column(T.StringType(), ps.Check.isin([m.OK, m.REJECTED])),
                                       "amount": ps.Column(money, ps.Check.gt(0)),
                                       "currency": ps.Column(T.StringType(), currency)}, name="results"),
        "ledger_entries": ps.DataFrameSchema({"amount": ps.Column(money, ps.Check.gt(0))}, name="ledger_entries"),
    }


# -- intake (alts) ----------------------------------------------------------------------------------
@processor_asset(inputs={"postings": In("postings")}, outputs={"instructions": Out("instructions", "0")},
                 error_queue="errors")
def intake(ctx: Any, postings: Any) -> pa.Table:
    """Copy POSTINGS (partitioned by the receiving participant) into the one clearing lane,
    keeping each posting's subject and offset as ``posting_partition`` / ``posting_offset``. It
    reads every partition: one lane per participant, each with its own steps and positions
    (processing/lanes.py), all writing partition "0" of ``instructions``. In Dagster its asset
    body is this function, called once per lane with new postings in a materialization (each
    lane's step delivered through its own protocol by the ``cues_step_io`` IO manager)."""
    from pyspark.sql import functions as F

    return _in_lane_order(postings.select(F.col("_partition").alias("posting_partition"),
                                          F.col("_offset").alias("posting_offset"), *m.POSTINGS.names, "_offset"))


def _in_lane_order(frame: Any) -> pa.Table:
    """Collect a step's output (it is collected once anyway) and sort it by the input offset on
    the driver: cheaper than a Spark sort (no sampling job, no shuffle) for one batch."""
    table = frame.toArrow() if hasattr(frame, "toArrow") else frame
    return table.sort_by("_offset").drop_columns(["_offset"])


# -- parse (map) ------------------------------------------------------------------------------------
@processor_asset(inputs={"instructions": "instructions"}, outputs={"parsed": "parsed"},
                 error_queue="errors")
def parse(ctx: Any, instructions: Any) -> pa.Table:
    """Parse the JSON payment instruction; ``malformed`` names the first failed check (missing
    message id, unknown participant in the header, payload not a JSON object, a missing field, an
    amount that is not a positive decimal with at most 2 places, a value date that is not a date)."""
    from pyspark.sql import functions as F

    obj = F.from_json("payload", "map<string,string>")
    df = instructions.withColumn("_obj", obj)
    field = {name: F.col("_obj").getItem(name) for name in (*m.PAYLOAD_FIELDS, "reference")}
    amount_ok = field["amount"].rlike(r"^[0-9]{1,15}(\.[0-9]{1,2})?$")
    date = F.expr("try_to_date(_obj['value_date'], 'yyyy-MM-dd')")
    participants = list(m.PARTICIPANTS)
    reason = (
        F.when(F.col("message_id").isNull() | (F.trim("message_id") == ""), F.lit(m.MISSING_MESSAGE_ID))
        .when(~F.col("sender").isin(participants) | (F.col("receiver") != F.col("posting_partition")),
              F.lit(m.UNKNOWN_PARTICIPANT))
        .when(F.col("_obj").isNull(), F.lit(m.PAYLOAD_NOT_JSON))
    )
    for name in m.PAYLOAD_FIELDS:
        reason = reason.when(field[name].isNull() | (F.trim(field[name]) == ""),
                             F.lit(f"{m.MISSING_FIELD}:{name}"))
    reason = (reason.when(~amount_ok, F.lit(m.BAD_AMOUNT))
              .when(field["amount"].try_cast("decimal(18,2)") <= 0, F.lit(m.BAD_AMOUNT))
              .when(date.isNull(), F.lit(m.BAD_VALUE_DATE)))
    return _in_lane_order(df.select(
        *m.INSTRUCTIONS.names,
        field["debtor_account"].alias("debtor_account"),
        field["creditor_account"].alias("creditor_account"),
        F.when(amount_ok, field["amount"].try_cast("decimal(18,2)")).alias("amount"),
        field["currency"].alias("currency"),
        date.alias("value_date"),
        field["reference"].alias("reference"),
        reason.alias("malformed"),
        "_offset",
    ))


# -- fx (source) ------------------------------------------------------------------------------------
def fixing(k: int, *, seed: int = 11) -> pa.Table:
    """Fixing ``k``: one rate per currency within 0.5% of the reference rate, a function of k."""
    rng = random.Random(f"fx:{seed}:{k}")
    currencies = sorted(m.BASE_RATES)
    rates = [1.0 if c == m.SETTLEMENT_CURRENCY else round(m.BASE_RATES[c] * (1 + rng.uniform(-0.005, 0.005)), 6)
             for c in currencies]
    at = FIXING_EPOCH + timedelta(minutes=10 * k)
    return pa.table({"fixing": [k] * len(currencies), "currency": currencies, "rate": rates,
                     "fixed_at": [at] * len(currencies)}, schema=m.FX_RATES)


def convert_position(lake: Any) -> tuple[int, int]:
    """Where ``convert`` has read up to in (parsed, fx_rates): the input positions its home queue
    ``priced`` stores with its last step (``pos:convert:{queue}/{partition}``), or, when its last step went
    through an attempt record (error rows, a lake of the previous protocol) that the home has not
    closed yet, that attempt's ends (recovery rolls it forward, so it counts as read)."""
    from deltalake import DeltaTable

    ends = (0, 0)
    done = -1
    if lake.has_queue("priced"):
        dt = lake.queue("priced").refresh()
        version = dt.transaction_version(PROCESSOR_STEP.id("convert"))
        postings = dt.transaction_version(LANE_POSITION.id("convert", "parsed", "0"))
        rates = dt.transaction_version(LANE_POSITION.id("convert", "fx_rates", "0"))
        if version is not None:
            done = int(version)
        if postings is not None and rates is not None:
            ends = (int(postings), int(rates))
    uri = lake.system_uri("backing", "convert")
    if not DeltaTable.is_deltatable(uri, storage_options=lake.options):
        return ends
    backing = lake.queue("convert", uri=uri)
    last = backing.last_offset("0")
    if last is None:
        return ends
    row = backing.read_arrow(partition="0", start=last, end=last + 1, columns=["snapshot"])
    snap = Snapshot.from_json(row["snapshot"][0].as_py())
    if snap.step > done or ends == (0, 0) and snap.step == done:
        return snap.inputs["postings"].end, snap.inputs["rates"].end
    return ends


def upstream_pending(lake: Any) -> bool:
    """Whether postings or instructions wait upstream of ``parsed`` (a heuristic: postings beyond
    what ``intake`` turned into instructions or errors, instructions beyond what ``parse`` parsed)."""
    postings = lake.queue("postings")
    posted = sum(postings.next_offset(p) for p in postings.partitions)
    instructions_end = lake.queue("instructions").next_offset("0")
    return (posted > instructions_end + lake.queue("errors").next_offset("0")
            or instructions_end > lake.queue("parsed").next_offset("0"))


def make_fx(seed: int = 11) -> Any:
    def fx(ctx: Any) -> pa.Table | None:
        """Quote on demand: publish fixing ``ctx.step`` (one rate per currency, EUR per unit) when
        ``convert`` has read every fixing published so far and instructions wait for it (parsed,
        or still upstream: so one pass over the graph in topological order, e.g. one Dagster run
        of every asset, gets a fixing before ``convert``); otherwise nothing (not a step)."""
        parsed_end = ctx.lake.queue("parsed").next_offset("0")
        rates_end = ctx.lake.queue("fx_rates").next_offset("0")
        read_postings, read_rates = convert_position(ctx.lake)
        if rates_end > read_rates:
            return None
        if parsed_end <= read_postings and not upstream_pending(ctx.lake):
            return None
        return fixing(ctx.step, seed=seed)

    return fx


# -- convert (join) ---------------------------------------------------------------------------------
def convert(ctx: Any, postings: Any, rates: Any) -> pa.Table:
    """Price each parsed instruction in EUR at the latest fixing of this batch (per currency);
    an unsupported currency leaves ``rate`` and ``settlement_amount`` null. Lane order is kept."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    latest = (rates.withColumn("_n", F.row_number().over(Window.partitionBy("currency").orderBy(F.desc("fixing"))))
              .where("_n = 1").select("currency", F.col("fixing").alias("_fixing"), F.col("rate").alias("_rate")))
    joined = postings.join(F.broadcast(latest), on="currency", how="left")
    amount = F.round(F.col("amount").cast("decimal(38,10)") * F.col("_rate").cast("decimal(38,10)"), 2)
    return _in_lane_order(joined.select(
        *m.PARSED.names, F.col("_fixing").alias("fixing"), F.col("_rate").alias("rate"),
        F.when(F.col("malformed").isNull(), amount.cast("decimal(18,2)")).alias("settlement_amount"), "_offset"))


# -- validate (fork) --------------------------------------------------------------------------------
def seen_message_ids(lake: Any) -> set[tuple[str, str]]:
    results = lake.queue("results")
    seen: set[tuple[str, str]] = set()
    for p in results.partitions:
        t = results.read_arrow(partition=p, columns=["sender", "message_id"])
        seen.update(zip(t["sender"].to_pylist(), t["message_id"].to_pylist(), strict=True))
    return seen


def current_balances(lake: Any) -> dict[str, Decimal]:
    """Opening balances from the directory plus every delivered ledger entry."""
    directory = lake.queue("accounts").read_arrow(partition="0", columns=["account", "opening_balance"])
    balances = dict(zip(directory["account"].to_pylist(), directory["opening_balance"].to_pylist(), strict=True))
    entries = lake.queue("ledger_entries").read_arrow(
        partition="0", columns=["debtor_account", "creditor_account", "amount"])
    if entries.num_rows:
        for col, sign in (("debtor_account", -1), ("creditor_account", 1)):
            sums = entries.group_by(col).aggregate([("amount", "sum")])
            for acct, total in zip(sums[col].to_pylist(), sums["amount_sum"].to_pylist(), strict=True):
                balances[acct] = balances.get(acct, Decimal(0)) + sign * total
    return balances


def validate(ctx: Any, priced: Any) -> dict[str, pa.Table]:
    """Route malformed instructions to ``malformed``; decide the others: REJECTED
    for a message id the sender used before (``duplicate_message_id``), a currency without a rate
    (``bad_currency``), a debtor or creditor account not in the directory (``unknown_account``), a
    debtor balance below the amount (``insufficient_funds``); else OK, booked as a ledger entry.
    Rows are decided in clearing-lane order (a replay always comes after its original).
    Sequential by nature, so the batch is collected to the driver (one Spark job)."""
    batch = priced.toArrow() if hasattr(priced, "toArrow") else priced
    rows = batch.sort_by("_offset").to_pylist()  # clearing-lane order
    seen = seen_message_ids(ctx.lake)
    balances = current_balances(ctx.lake)
    directory_owner = _directory_owners(ctx.lake)
    results, entries, malformed = [], [], []
    for r in rows:
        if r["malformed"] is not None:
            malformed.append({k: r[k] for k in m.MALFORMED.names if k != "reason"} | {"reason": r["malformed"]})
            continue
        key = (r["sender"], r["message_id"])
        amount = r["settlement_amount"]
        if key in seen:
            reason = m.DUPLICATE_MESSAGE_ID
        elif r["rate"] is None:
            reason = m.BAD_CURRENCY
        elif (directory_owner.get(r["debtor_account"]) != r["sender"]
              or directory_owner.get(r["creditor_account"]) != r["receiver"]):
            reason = m.UNKNOWN_ACCOUNT
        elif balances.get(r["debtor_account"], Decimal(0)) < amount:
            reason = m.INSUFFICIENT_FUNDS
        else:
            reason = None
        seen.add(key)
        if reason is None:
            balances[r["debtor_account"]] -= amount
            balances[r["creditor_account"]] += amount
            entries.append({"entry_id": f"{r['sender']}/{r['message_id']}", "sender": r["sender"],
                            "receiver": r["receiver"], "debtor_account": r["debtor_account"],
                            "creditor_account": r["creditor_account"], "amount": amount,
                            "value_date": r["value_date"], "posting_partition": r["posting_partition"],
                            "posting_offset": r["posting_offset"]})
        results.append({k: r[k] for k in m.RESULTS.names if k not in ("status", "reason")}
                       | {"status": m.REJECTED if reason else m.OK, "reason": reason})
    out = {"results": pa.Table.from_pylist(results, schema=m.RESULTS),
           "ledger_entries": pa.Table.from_pylist(entries, schema=m.LEDGER_ENTRIES),
           "malformed": pa.Table.from_pylist(malformed, schema=m.MALFORMED)}
    return {k: v for k, v in out.items() if v.num_rows}  # empty outputs are simply not written


def _directory_owners(lake: Any) -> dict[str, str]:
    t = lake.queue("accounts").read_arrow(partition="0", columns=["account", "participant"])
    return dict(zip(t["account"].to_pylist(), t["participant"].to_pylist(), strict=True))


# -- ledger (sink) ----------------------------------------------------------------------------------
def ledger(ctx: Any, entries: Any) -> None:
    """Book the entries and move the balances in PostgreSQL, once per delivery (the delivery hash
    row commits with them). Needs the ``ledger`` resource (:class:`LedgerDB`)."""
    table = entries.toArrow() if hasattr(entries, "toArrow") else entries
    book(ctx, ctx.resources["ledger"], table.drop_columns([c for c in table.column_names if c.startswith("_")]))


# -- the graph --------------------------------------------------------------------------------------
def payments_graph(*, batch_size: int = DEFAULT_BATCH, fx_seed: int = 11,
                   participants: tuple[str, ...] = m.PARTICIPANTS) -> Graph:
    """The reference payments graph (queues, processors, options)."""
    opts = Options(batch_size=batch_size)
    FUNCTION = AssetBody.FUNCTION  # noqa: N806 - in Dagster the asset body is the function
    spark_contracts = business_contracts()
    return Graph.build(
        name=GRAPH_NAME,
        queues=[
            QueueDef("postings", m.POSTINGS, participants),
            QueueDef("instructions", m.INSTRUCTIONS, contract=instructions_contract()),
            QueueDef("parsed", m.PARSED, contract=spark_contracts["parsed"]),
            QueueDef("fx_rates", m.FX_RATES, contract=spark_contracts["fx_rates"]),
            QueueDef("priced", m.PRICED, contract=spark_contracts["priced"]),
            QueueDef("results", m.RESULTS, participants, contract=spark_contracts["results"]),
            QueueDef("ledger_entries", m.LEDGER_ENTRIES, contract=spark_contracts["ledger_entries"]),
            QueueDef("malformed", m.MALFORMED),
            QueueDef("accounts", m.ACCOUNTS),
            QueueDef("errors", ERROR_SCHEMA),
        ],
        processors=[
            Processor("fx", Kind.SOURCE, make_fx(fx_seed), outputs={"rates": Out("fx_rates")}, options=opts,
                      asset_body=FUNCTION),
            # declared on their functions (@processor_asset): in Dagster the asset body of intake
            # is `intake` (one step per lane of postings with work), of parse `parse` (one step)
            dataclasses.replace(intake, options=opts),
            dataclasses.replace(parse, options=opts),
            Processor("convert", Kind.JOIN, convert, {"postings": In("parsed"), "rates": In("fx_rates")},
                      {"priced": Out("priced")}, error_queue="errors", options=opts, asset_body=FUNCTION),
            Processor("validate", Kind.FORK, validate, {"priced": In("priced")},
                      {"results": Out("results", partition=None, partition_column="sender"),
                       "ledger_entries": Out("ledger_entries"), "malformed": Out("malformed")},
                      options=opts, asset_body=FUNCTION),
            Processor("ledger", Kind.SINK, ledger, {"entries": In("ledger_entries")}, options=opts,
                      asset_body=FUNCTION),
        ],
    )


graph = payments_graph()  # for `cues graph show cues_platform.reference.pipeline:graph`

__all__ = ["GRAPH_NAME", "convert", "fixing", "graph", "instructions_contract", "intake", "ledger", "make_fx", "parse",
           "payments_graph", "validate"]
