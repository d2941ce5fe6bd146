"""The payments domain of the reference pipeline: participants, currencies, queue schemas, reasons.

Participants (banks) post payment instructions on ``postings`` with the *receiving* participant as
the subject (partition), as in the postings protocol: a message has a header (sender ``n``,
receiver ``p``), a message id unique per sender, a replay counter, the time of its first posting
(``inception_datum``) and of its last replay (``last_datum``), and an arbitrary payload (here a JSON
payment instruction). Every well-formed posting gets exactly one row on ``results`` (subject: the
sender) with its processing status OK or REJECTED and a reason; malformed postings go to the
``malformed`` error queue; OK postings become ``ledger_entries`` that the ledger sink books in
PostgreSQL.
"""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa

PARTICIPANTS: tuple[str, ...] = ("bank-a", "bank-b", "bank-c", "bank-d")
SETTLEMENT_CURRENCY = "EUR"
# Reference rates: EUR per one unit of the currency (the fx source fluctuates around them by <= 0.5%).
BASE_RATES: dict[str, float] = {
    "EUR": 1.0, "USD": 0.92, "GBP": 1.17, "CHF": 1.06, "SEK": 0.087, "JPY": 0.0061,
}
CURRENCY_DECIMALS: dict[str, int] = {"JPY": 0}
MONEY = pa.decimal128(18, 2)
UTC_TS = pa.timestamp("us", tz="UTC")

# Processing statuses and REJECTED reasons (results.reason)
OK, REJECTED = "OK", "REJECTED"
UNKNOWN_ACCOUNT = "unknown_account"
INSUFFICIENT_FUNDS = "insufficient_funds"
BAD_CURRENCY = "bad_currency"
DUPLICATE_MESSAGE_ID = "duplicate_message_id"
REJECT_REASONS = (DUPLICATE_MESSAGE_ID, BAD_CURRENCY, UNKNOWN_ACCOUNT, INSUFFICIENT_FUNDS)

# Malformed reasons (malformed.reason); the first failing check names the row
MISSING_MESSAGE_ID = "missing_message_id"
PAYLOAD_NOT_JSON = "payload_not_json"
MISSING_FIELD = "missing_field"  # written as "missing_field:<name>"
BAD_AMOUNT = "bad_amount"
BAD_VALUE_DATE = "bad_value_date"
UNKNOWN_PARTICIPANT = "unknown_participant"
MALFORMED_REASONS = (MISSING_MESSAGE_ID, PAYLOAD_NOT_JSON, MISSING_FIELD, BAD_AMOUNT, BAD_VALUE_DATE,
                     UNKNOWN_PARTICIPANT)
PAYLOAD_FIELDS = ("debtor_account", "creditor_account", "amount", "currency", "value_date")


def _f(name: str, type_: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


HEADER = [
    _f("message_id", pa.string()),  # nullable: a malformed posting may lack it
    _f("sender", pa.string(), False),
    _f("receiver", pa.string(), False),
    _f("replays", pa.int32(), False),
    _f("inception_datum", UTC_TS, False),
    _f("last_datum", UTC_TS, False),
]
TRACE = [_f("posting_partition", pa.string(), False), _f("posting_offset", pa.int64(), False)]

#: what participants post (partition = receiving participant)
POSTINGS = pa.schema([*HEADER, _f("payload", pa.string())])
#: postings of every subject merged into one clearing lane, with where each came from
INSTRUCTIONS = pa.schema([*TRACE, *HEADER, _f("payload", pa.string())])
#: instructions with the payload parsed; ``malformed`` names the first failed check (else null)
PARSED = pa.schema([
    *TRACE, *HEADER, _f("payload", pa.string()),
    _f("debtor_account", pa.string()), _f("creditor_account", pa.string()), _f("amount", MONEY),
    _f("currency", pa.string()), _f("value_date", pa.date32()), _f("reference", pa.string()),
    _f("malformed", pa.string()),
])
#: parsed instructions with the fixing used and the amount in the settlement currency
PRICED = pa.schema([*PARSED, _f("fixing", pa.int64()), _f("rate", pa.float64()),
                    _f("settlement_amount", MONEY)])
#: one fx fixing = one row per currency
FX_RATES = pa.schema([_f("fixing", pa.int64(), False), _f("currency", pa.string(), False),
                      _f("rate", pa.float64(), False), _f("fixed_at", UTC_TS, False)])
#: the outcome of every well-formed posting (partition = sending participant)
RESULTS = pa.schema([
    _f("message_id", pa.string(), False), _f("sender", pa.string(), False),
    _f("receiver", pa.string(), False), _f("status", pa.string(), False), _f("reason", pa.string()),
    _f("debtor_account", pa.string(), False), _f("creditor_account", pa.string(), False),
    _f("amount", MONEY, False), _f("currency", pa.string(), False), _f("rate", pa.float64()),
    _f("settlement_amount", MONEY), _f("value_date", pa.date32(), False),
    _f("replays", pa.int32(), False), _f("inception_datum", UTC_TS, False),
    _f("last_datum", UTC_TS, False), _f("fixing", pa.int64()), *TRACE,
])
#: OK postings to book (amounts in the settlement currency)
LEDGER_ENTRIES = pa.schema([
    _f("entry_id", pa.string(), False), _f("sender", pa.string(), False),
    _f("receiver", pa.string(), False), _f("debtor_account", pa.string(), False),
    _f("creditor_account", pa.string(), False), _f("amount", MONEY, False),
    _f("value_date", pa.date32(), False), *TRACE,
])
#: the error queue for malformed input: the raw posting and the reason
MALFORMED = pa.schema([
    *TRACE, _f("message_id", pa.string()), _f("sender", pa.string(), False),
    _f("receiver", pa.string(), False), _f("payload", pa.string()), _f("reason", pa.string(), False),
    _f("last_datum", UTC_TS, False),
])
#: the account directory (reference data): every participant's accounts and opening balances
ACCOUNTS = pa.schema([
    _f("account", pa.string(), False), _f("participant", pa.string(), False),
    _f("holder", pa.string(), False), _f("opening_balance", MONEY, False),
])


def money(value: float | str | Decimal) -> Decimal:
    return Decimal(str(value)).quantize(Decimal("0.01"))
