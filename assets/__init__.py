"""The reference deployment's assets; each module contributes its definitions, merged here."""

from dagster import Definitions

from assets.payments import defs as payments_defs
from assets.settlement import defs as settlement_defs
from assets.traffic import defs as traffic_defs

defs = Definitions.merge(payments_defs, settlement_defs, traffic_defs)
