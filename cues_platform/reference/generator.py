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

from cues_platform.queues import Lake, Queue
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
    accounts = _published_directory(lake.queue("accounts"), spec)
    traffic = Traffic(spec, EXPECTED.empty_table(), directory_rows=accounts.num_rows)
    gateways = _Gateways(lake.queue("postings"), spec, rng, traffic)
    draw = _Draw(spec, rng, accounts, traffic.counts)
    clock = spec.start
    wall0 = time.monotonic()
    for produced in range(1, spec.messages + 1):
        clock += timedelta(seconds=rng.expovariate(spec.rate))
        if spec.realtime:
            due = wall0 + (clock - spec.start).total_seconds()
            time.sleep(max(0.0, due - time.monotonic()))
        gateways.add(*draw.posting(clock))
        if progress:
            progress(produced, spec.messages)
    for sender in spec.participants:
        gateways.flush(sender)
    traffic.expected = pa.Table.from_pylist(gateways.expected_rows, schema=EXPECTED).sort_by(
        [("posting_partition", "ascending"), ("posting_offset", "ascending")])
    traffic.elapsed = time.monotonic() - started
    return traffic


def _published_directory(directory_queue: Queue, spec: TrafficSpec) -> pa.Table:
    """The account directory: reference data, published once (sequence 0 of producer
    ``directory``); later traffic books against the one already published."""
    if directory_queue.count():
        return directory_queue.read_arrow(partition="0").select(m.ACCOUNTS.names).cast(m.ACCOUNTS)
    accounts = directory(spec)
    directory_queue.producer(producer_id="directory").send(accounts, partition="0", sequence=0)
    return accounts


class _Gateways:
    """The participants' gateways: one idempotent producer each, sending a batch of ``spec.batch``
    postings at a time (one sequence per batch) and, with ``p_resend``, the same batch again."""

    def __init__(self, postings: Queue, spec: TrafficSpec, rng: random.Random, traffic: Traffic) -> None:
        self.spec, self.rng, self.traffic = spec, rng, traffic
        self.producers = {n: postings.producer(producer_id=f"gateway-{n}") for n in spec.participants}
        self.buffers: dict[str, list[tuple[dict, dict]]] = {n: [] for n in spec.participants}
        self.expected_rows: list[dict] = []  # each posting's expected outcome, at its offset

    def add(self, sender: str, posting: dict, exp: dict) -> None:
        self.buffers[sender].append((posting, exp))
        if len(self.buffers[sender]) >= self.spec.batch:
            self.flush(sender)

    def flush(self, sender: str) -> None:
        rows = self.buffers[sender]
        if not rows:
            return
        batches: dict[str, list[dict]] = {}
        for posting, _ in rows:
            batches.setdefault(posting["receiver_subject"], []).append(posting)
        tables = {p: pa.Table.from_pylist([{k: v for k, v in r.items() if k != "receiver_subject"} for r in rs],
                                          schema=m.POSTINGS) for p, rs in batches.items()}
        gw = self.producers[sender]
        result = gw.send_many(tables)
        self.traffic.sends += 1
        offsets = {p: start for p, (start, _end) in result.ranges.items()}
        for posting, exp in rows:
            p = posting["receiver_subject"]
            self.expected_rows.append(exp | {"posting_partition": p, "posting_offset": offsets[p]})
            offsets[p] += 1
        if self.rng.random() < self.spec.p_resend:  # the acknowledgement was "lost": send again, same sequence
            again = gw.send_many(tables, sequence=gw.next_sequence - 1)
            assert again.duplicate, "an idempotent resend must be a no-op"
            self.traffic.resends += 1
        self.buffers[sender] = []


class _Draw:
    """The next posting and its expected outcome. The traffic is deterministic by seed: the
    methods draw from ``rng`` in a fixed order, which is the order of the code below."""

    def __init__(self, spec: TrafficSpec, rng: random.Random, accounts: pa.Table, counts: Counter) -> None:
        self.spec, self.rng, self.counts = spec, rng, counts
        self.by_participant: dict[str, list[str]] = {}
        self.balances: dict[str, float] = {}
        for a in accounts.to_pylist():
            self.by_participant.setdefault(a["participant"], []).append(a["account"])
            self.balances[a["account"]] = float(a["opening_balance"])
        self.valid_sent: dict[str, list[dict]] = {n: [] for n in spec.participants}
        self.seq_ids: Counter = Counter()

    def posting(self, clock: datetime) -> tuple[str, dict, dict]:
        """(sender, posting, expected outcome) of the posting sent at ``clock``."""
        rng, spec = self.rng, self.spec
        sender = rng.choice(spec.participants)
        receiver = rng.choice([p for p in spec.participants if p != sender])
        kind = self._kind()
        if kind == "duplicate":
            if self.valid_sent[sender]:
                return sender, *self._replay(sender, clock)
            kind = "valid"
        return sender, *self._instruction(kind, sender, receiver, clock)

    def _kind(self) -> str:
        """What this posting is: valid, or one of the cases, with the spec's probabilities."""
        spec = self.spec
        roll = self.rng.random()
        cuts = [("malformed", spec.p_malformed), ("unknown_account", spec.p_unknown_account),
                ("insufficient_funds", spec.p_insufficient_funds), ("bad_currency", spec.p_bad_currency),
                ("duplicate", spec.p_duplicate), ("late", spec.p_late),
                ("contract_break", spec.p_contract_break)]
        for name, p in cuts:
            if roll < p:
                return name
            roll -= p
        return "valid"

    def _replay(self, sender: str, clock: datetime) -> tuple[dict, dict]:
        """A sender replays one of its valid postings (same message id, replays + 1)."""
        original = self.rng.choice(self.valid_sent[sender])
        posting = dict(original["posting"]) | {"replays": original["posting"]["replays"] + 1,
                                               "last_datum": clock}
        exp = {"sender": sender, "message_id": posting["message_id"], "outcome": m.REJECTED,
               "reason": m.DUPLICATE_MESSAGE_ID, "value_date": original["value_date"],
               "late": False, "amount_eur": None}
        self.counts[f"{m.REJECTED}:{m.DUPLICATE_MESSAGE_ID}"] += 1
        return posting, exp

    def _instruction(self, kind: str, sender: str, receiver: str, clock: datetime) -> tuple[dict, dict]:
        """A new payment instruction of ``kind`` (valid or one of the cases but a duplicate)."""
        rng, spec = self.rng, self.spec
        self.seq_ids[sender] += 1
        message_id: str | None = f"{sender}-{spec.seed:04d}-{self.seq_ids[sender]:07d}"
        value_day, inception, late = self._dates(kind, clock)
        currency = rng.choices(list(CURRENCY_MIX), weights=list(CURRENCY_MIX.values()))[0]
        amount_eur = min(25_000.0, math.exp(rng.gauss(math.log(800), 1.0)))
        debtor, creditor = self._parties(sender, receiver, amount_eur)
        outcome, reason = m.OK, None
        if kind == "unknown_account":
            outcome, reason = m.REJECTED, m.UNKNOWN_ACCOUNT
            creditor = self._unknown_creditor(receiver)
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
        if kind == "malformed":
            outcome = "MALFORMED"
            message_id, reason, header_sender = self._malform(payload, message_id, sender)
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
        self.counts[outcome if reason is None or outcome == CONTRACT else f"{outcome}:{reason.split(':')[0]}"] += 1
        self.counts["late"] += late
        if outcome == m.OK:
            self.valid_sent[sender].append({"posting": posting, "value_date": value_day})
            settle = float(amount) * m.BASE_RATES[currency] * 1.01
            self.balances[debtor] -= settle
            self.balances[creditor] += settle / 1.02
        return posting, exp

    def _dates(self, kind: str, clock: datetime) -> tuple[date, datetime, bool]:
        """(value date, inception, late): a late posting is for the previous business day."""
        value_day = clock.date()
        inception = clock
        late = kind == "late" and value_day > self.spec.start.date()
        if late:
            value_day = value_day - timedelta(days=1)
            inception = datetime.combine(value_day, datetime.min.time(), UTC) + timedelta(
                hours=16, seconds=self.rng.uniform(0, 8 * 3600 - 1))
        return value_day, inception, late

    def _parties(self, sender: str, receiver: str, amount_eur: float) -> tuple[str, str]:
        """A debtor with a safe margin (normal traffic is never short of funds) and a creditor."""
        debtor = ""
        for _ in range(20):
            debtor = self.rng.choice(self.by_participant[sender])
            if self.balances[debtor] > 2 * amount_eur + 100_000:
                break
        return debtor, self.rng.choice(self.by_participant[receiver])

    def _unknown_creditor(self, receiver: str) -> str:
        rng = self.rng
        if rng.random() < 0.5:
            return f"{receiver}-{rng.randint(9000, 9999):04d}"
        # an account of another participant than the one addressed
        return rng.choice(self.by_participant[rng.choice([p for p in self.spec.participants if p != receiver])])

    def _malform(self, payload: dict[str, Any], message_id: str | None,
                 sender: str) -> tuple[str | None, str, str]:
        """Break the posting one way (``payload`` in place): (message id, reason, header sender)."""
        rng = self.rng
        variant = rng.choice(MALFORMED_KINDS)
        if variant == "missing_message_id":
            return None, m.MISSING_MESSAGE_ID, sender
        if variant == "not_json":
            return message_id, m.PAYLOAD_NOT_JSON, sender
        if variant == "missing_field":
            gone = rng.choice(m.PAYLOAD_FIELDS)
            del payload[gone]
            return message_id, f"{m.MISSING_FIELD}:{gone}", sender
        if variant == "bad_amount":
            payload["amount"] = rng.choice(["12,50", "-40.00", "1e3", "12.345", "ten euros", "0.00"])
            return message_id, m.BAD_AMOUNT, sender
        if variant == "bad_value_date":
            payload["value_date"] = rng.choice(["2026-13-01", "21/11/2026", "tomorrow"])
            return message_id, m.BAD_VALUE_DATE, sender
        return message_id, m.UNKNOWN_PARTICIPANT, "bank-x"


def amounts_in(values: list[Decimal | None]) -> Decimal:
    return sum((v for v in values if v is not None), Decimal(0))
