"""Realistic payments traffic for the reference pipeline, deterministic by seed.

Four participants' gateways post payment instructions to ``postings`` (subject = the receiving
participant) through idempotent producers (``gateway-{sender}``, one sequence per batch). The
traffic arrives at ``rate`` postings per second of traffic time (Poisson arrivals from ``start``;
``realtime=True`` also paces the sends on the wall clock) and mixes in, with the configured
probabilities, every case the pipeline must handle:

- malformed postings (missing message id, payload that is not JSON, a missing field, a bad amount,
  a bad value date, an unknown participant in the header) → the ``malformed`` error queue;
- unknown accounts, amounts beyond any balance (insufficient funds), unsupported currencies →
  a REJECTED result with that reason;
- duplicate message ids: a sender replays an earlier posting (replays + 1, same message id) →
  REJECTED ``duplicate_message_id`` (the first stays OK);
- contract breaks: a gateway with a skewed clock stamps ``last_datum`` before ``inception_datum``
  → breaks the contract of ``instructions``: the ``errors`` queue (one row, the failed check named);
- late data: an instruction for the previous business day that arrives today → OK, counted in
  that earlier day's settlement report;
- producer resends: a batch whose acknowledgement was "lost" is sent again with the SAME sequence
  → absorbed by the idempotent producer (no row is written twice).

Every other posting is valid and never short of funds (the generator keeps a safety margin).
:func:`generate` returns the expected outcome of every posting, keyed by its subject and offset.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa

from cues_platform.queues import Lake
from cues_platform.reference import model as m

CURRENCY_MIX = {"EUR": 0.6, "USD": 0.15, "GBP": 0.1, "CHF": 0.07, "SEK": 0.05, "JPY": 0.03}
UNSUPPORTED_CURRENCIES = ("XAU", "ZWL", "BTC")
CONTRACT = "CONTRACT"  # expected outcome: broke the contract of ``instructions`` → ``errors``
CONTRACT_REASON = "contract:instructions"
MALFORMED_KINDS = ("missing_message_id", "not_json", "missing_field", "bad_amount", "bad_value_date",
                   "unknown_participant")
EXPECTED = pa.schema([
    pa.field("posting_partition", pa.string(), False), pa.field("posting_offset", pa.int64(), False),
    pa.field("sender", pa.string(), False), pa.field("message_id", pa.string()),
    pa.field("outcome", pa.string(), False),  # OK | REJECTED | MALFORMED | CONTRACT
    pa.field("reason", pa.string()), pa.field("value_date", pa.date32()),
    pa.field("late", pa.bool_(), False), pa.field("amount_eur", m.MONEY),
])


@dataclass(frozen=True)
class TrafficSpec:
    messages: int = 3_000
    rate: float = 0.03  # postings per second of traffic time (3,000 → about 28 hours: two days)
    start: datetime = datetime(2026, 11, 20, 6, 0, tzinfo=UTC)
    seed: int = 7
    batch: int = 100  # postings per gateway send
    accounts_per_participant: int = 12
    p_malformed: float = 0.02
    p_unknown_account: float = 0.015
    p_insufficient_funds: float = 0.01
    p_bad_currency: float = 0.015
    p_duplicate: float = 0.02
    p_late: float = 0.03
    p_contract_break: float = 0.005
    p_resend: float = 0.1
    realtime: bool = False
    participants: tuple[str, ...] = m.PARTICIPANTS


@dataclass
class Traffic:
    spec: TrafficSpec
    expected: pa.Table
    sends: int = 0
    resends: int = 0  # batches re-sent with the same sequence (absorbed)
    directory_rows: int = 0
    elapsed: float = 0.0
    counts: Counter = field(default_factory=Counter)  # "OK", "REJECTED:reason", "MALFORMED:reason", "late"

    @property
    def postings(self) -> int:
        return self.expected.num_rows

    @property
    def days(self) -> list[date]:
        return sorted({d for d in self.expected["value_date"].to_pylist() if d is not None})


def directory(spec: TrafficSpec) -> pa.Table:
    rng = random.Random(f"directory:{spec.seed}")
    rows = []
    for p in spec.participants:
        for i in range(1, spec.accounts_per_participant + 1):
            rows.append({"account": f"{p}-{i:04d}", "participant": p, "holder": f"{p} client {i}",
                         "opening_balance": m.money(round(rng.uniform(1_000_000, 3_000_000), 2))})
    return pa.Table.from_pylist(rows, schema=m.ACCOUNTS)


def _native(amount_eur: float, currency: str) -> str:
    places = m.CURRENCY_DECIMALS.get(currency, 2)
    value = amount_eur / m.BASE_RATES[currency]
    return f"{value:.{places}f}"


def generate(lake: Lake, spec: TrafficSpec | None = None, *,
             progress: Callable[[int, int], None] | None = None) -> Traffic:
    """Post the traffic of ``spec`` to ``lake`` (queues ``postings`` and ``accounts`` must exist,
    e.g. created by the graph's runner or :func:`cues_platform.processing.runner.create_queues`)."""
    spec = spec or TrafficSpec()
    started = time.monotonic()
    rng = random.Random(spec.seed)
    postings = lake.queue("postings")
    directory_queue = lake.queue("accounts")
    if directory_queue.count():  # reference data, published once: later traffic books against it
        accounts = directory_queue.read_arrow(partition="0").select(m.ACCOUNTS.names).cast(m.ACCOUNTS)
    else:
        accounts = directory(spec)
        directory_queue.producer(producer_id="directory").send(accounts, partition="0", sequence=0)
    by_participant: dict[str, list[str]] = {}
    balances: dict[str, float] = {}
    for a in accounts.to_pylist():
        by_participant.setdefault(a["participant"], []).append(a["account"])
        balances[a["account"]] = float(a["opening_balance"])
    gateways = {n: postings.producer(producer_id=f"gateway-{n}") for n in spec.participants}
    buffers: dict[str, list[tuple[dict, dict]]] = {n: [] for n in spec.participants}
    valid_sent: dict[str, list[dict]] = {n: [] for n in spec.participants}
    expected_rows: list[dict] = []
    traffic = Traffic(spec, EXPECTED.empty_table(), directory_rows=accounts.num_rows)
    seq_ids = Counter()
    clock = spec.start
    wall0 = time.monotonic()
    produced = 0

    def flush(sender: str) -> None:
        rows = buffers[sender]
        if not rows:
            return
        batches: dict[str, list[dict]] = {}
        for posting, _ in rows:
            batches.setdefault(posting["receiver_subject"], []).append(posting)
        tables = {p: pa.Table.from_pylist([{k: v for k, v in r.items() if k != "receiver_subject"} for r in rs],
                                          schema=m.POSTINGS) for p, rs in batches.items()}
        gw = gateways[sender]
        result = gw.send_many(tables)
        traffic.sends += 1
        offsets = {p: start for p, (start, _end) in result.ranges.items()}
        for posting, exp in rows:
            p = posting["receiver_subject"]
            expected_rows.append(exp | {"posting_partition": p, "posting_offset": offsets[p]})
            offsets[p] += 1
        if rng.random() < spec.p_resend:  # the acknowledgement was "lost": send again, same sequence
            again = gw.send_many(tables, sequence=gw.next_sequence - 1)
            assert again.duplicate, "an idempotent resend must be a no-op"
            traffic.resends += 1
        buffers[sender] = []

    while produced < spec.messages:
        clock += timedelta(seconds=rng.expovariate(spec.rate))
        if spec.realtime:
            due = wall0 + (clock - spec.start).total_seconds()
            time.sleep(max(0.0, due - time.monotonic()))
        sender = rng.choice(spec.participants)
        receiver = rng.choice([p for p in spec.participants if p != sender])
        roll = rng.random()
        cuts = [("malformed", spec.p_malformed), ("unknown_account", spec.p_unknown_account),
                ("insufficient_funds", spec.p_insufficient_funds), ("bad_currency", spec.p_bad_currency),
                ("duplicate", spec.p_duplicate), ("late", spec.p_late),
                ("contract_break", spec.p_contract_break)]
        kind = "valid"
        for name, p in cuts:
            if roll < p:
                kind = name
                break
            roll -= p
        if kind == "duplicate":
            if not valid_sent[sender]:
                kind = "valid"
            else:
                original = rng.choice(valid_sent[sender])
                posting = dict(original["posting"]) | {"replays": original["posting"]["replays"] + 1,
                                                       "last_datum": clock}
                exp = {"sender": sender, "message_id": posting["message_id"], "outcome": m.REJECTED,
                       "reason": m.DUPLICATE_MESSAGE_ID, "value_date": original["value_date"],
                       "late": False, "amount_eur": None}
                buffers[sender].append((posting, exp))
                traffic.counts[f"{m.REJECTED}:{m.DUPLICATE_MESSAGE_ID}"] += 1
                produced += 1
                if len(buffers[sender]) >= spec.batch:
                    flush(sender)
                if progress:
                    progress(produced, spec.messages)
                continue
        seq_ids[sender] += 1
        message_id = f"{sender}-{spec.seed:04d}-{seq_ids[sender]:07d}"
        value_day = clock.date()
        inception = clock
        late = kind == "late" and value_day > spec.start.date()
        if late:
            value_day = value_day - timedelta(days=1)
            inception = datetime.combine(value_day, datetime.min.time(), UTC) + timedelta(
                hours=16, seconds=rng.uniform(0, 8 * 3600 - 1))
        currency = rng.choices(list(CURRENCY_MIX), weights=list(CURRENCY_MIX.values()))[0]
        amount_eur = min(25_000.0, math.exp(rng.gauss(math.log(800), 1.0)))
        debtor = creditor = None
        for _ in range(20):  # a debtor with a safe margin (normal traffic is never short of funds)
            debtor = rng.choice(by_participant[sender])
            if balances[debtor] > 2 * amount_eur + 100_000:
                break
        creditor = rng.choice(by_participant[receiver])
        outcome, reason = m.OK, None
        if kind == "unknown_account":
            outcome, reason = m.REJECTED, m.UNKNOWN_ACCOUNT
            if rng.random() < 0.5:
                creditor = f"{receiver}-{rng.randint(9000, 9999):04d}"
            else:  # an account of another participant than the one addressed
                creditor = rng.choice(by_participant[rng.choice([p for p in spec.participants if p != receiver])])
        elif kind == "insufficient_funds":
            outcome, reason, currency = m.REJECTED, m.INSUFFICIENT_FUNDS, "EUR"
            amount_eur = rng.uniform(50_000_000, 90_000_000)
        elif kind == "bad_currency":
            outcome, reason = m.REJECTED, m.BAD_CURRENCY
        amount = (_native(amount_eur, currency) if kind != "bad_currency"
                  else f"{amount_eur:.2f}")
        if kind == "bad_currency":
            currency = rng.choice(UNSUPPORTED_CURRENCIES)
        payload: dict[str, Any] = {"debtor_account": debtor, "creditor_account": creditor, "amount": amount,
                                   "currency": currency, "value_date": value_day.isoformat(),
                                   "reference": f"INV-{rng.randint(100000, 999999)}"}
        header_sender = sender
        raw: str | None
        if kind == "malformed":
            outcome = "MALFORMED"
            variant = rng.choice(MALFORMED_KINDS)
            if variant == "missing_message_id":
                message_id, reason = None, m.MISSING_MESSAGE_ID  # type: ignore[assignment]
            elif variant == "not_json":
                reason = m.PAYLOAD_NOT_JSON
            elif variant == "missing_field":
                gone = rng.choice(m.PAYLOAD_FIELDS)
                del payload[gone]
                reason = f"{m.MISSING_FIELD}:{gone}"
            elif variant == "bad_amount":
                payload["amount"] = rng.choice(["12,50", "-40.00", "1e3", "12.345", "ten euros", "0.00"])
                reason = m.BAD_AMOUNT
            elif variant == "bad_value_date":
                payload["value_date"] = rng.choice(["2026-13-01", "21/11/2026", "tomorrow"])
                reason = m.BAD_VALUE_DATE
            else:
                header_sender, reason = "bank-x", m.UNKNOWN_PARTICIPANT
        if kind == "contract_break":  # the gateway's clock is behind: last posting before the first
            outcome, reason = CONTRACT, CONTRACT_REASON
            inception = clock + timedelta(seconds=rng.uniform(60, 3600))
        raw = json.dumps(payload, separators=(",", ":"))
        if outcome == "MALFORMED" and reason == m.PAYLOAD_NOT_JSON:
            raw = rng.choice([raw[: len(raw) // 2],
                              f"<Document><CdtTrfTxInf><Amt Ccy=\"{currency}\">{amount}</Amt></CdtTrfTxInf></Document>"])
        posting = {"message_id": message_id, "sender": header_sender, "receiver": receiver, "replays": 0,
                   "inception_datum": inception, "last_datum": clock, "payload": raw,
                   "receiver_subject": receiver}
        exp = {"sender": header_sender, "message_id": message_id, "outcome": outcome, "reason": reason,
               "value_date": value_day if outcome in (m.OK, m.REJECTED) else None, "late": late,
               "amount_eur": m.money(amount_eur) if outcome == m.OK and currency == "EUR" else None}
        buffers[sender].append((posting, exp))
        traffic.counts[outcome if reason is None or outcome == CONTRACT else f"{outcome}:{reason.split(':')[0]}"] += 1
        traffic.counts["late"] += late
        if outcome == m.OK:
            valid_sent[sender].append({"posting": posting, "value_date": value_day})
            settle = float(amount) * m.BASE_RATES[currency] * 1.01
            balances[debtor] -= settle
            balances[creditor] += settle / 1.02
        produced += 1
        if len(buffers[sender]) >= spec.batch:
            flush(sender)
        if progress:
            progress(produced, spec.messages)
    for sender in spec.participants:
        flush(sender)
    traffic.expected = pa.Table.from_pylist(expected_rows, schema=EXPECTED).sort_by(
        [("posting_partition", "ascending"), ("posting_offset", "ascending")])
    traffic.elapsed = time.monotonic() - started
    return traffic


def amounts_in(values: list[Decimal | None]) -> Decimal:
    return sum((v for v in values if v is not None), Decimal(0))
