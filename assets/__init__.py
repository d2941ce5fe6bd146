"""The reference deployment's assets; each module contributes its definitions, merged here."""

from dagster import Definitions

from assets.participants import participant_defs
from assets.payments import defs as payments_defs
from assets.settlement import defs as settlement_defs
from assets.traffic import defs as traffic_defs

# the postings protocol participants of $CUES_PARTICIPANTS (default bank-a producer, bank-x consumer)
defs = Definitions.merge(payments_defs, settlement_defs, traffic_defs, participant_defs())
