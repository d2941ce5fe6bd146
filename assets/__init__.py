"""The reference deployment's assets; each module contributes its definitions, merged here."""

from dagster import Definitions

from assets.participants import participant_defs
from assets.payments import defs as payments_defs
from assets.settlement import defs as settlement_defs
from assets.traffic import defs as traffic_defs
from cues_platform.dagster import build_maintenance_definitions

# the postings protocol participants of $CUES_PARTICIPANTS (default bank-a producer, bank-x consumer);
# nightly maintenance of each lake (retention, compaction, checkpoint, vacuum: cues_maintenance)
defs = Definitions.merge(
    payments_defs, settlement_defs, traffic_defs, participant_defs(),
    build_maintenance_definitions(),
    build_maintenance_definitions(lake_key="participants_lake", job_name="cues_maintenance_participants",
                                  cron="30 3 * * *"),
)
