"""The reference deployment's resources; each module contributes its own.

The same instances are handed to ``build_definitions`` in ``assets/``, so merging the two
``Definitions`` sees one resource per key.
"""

from dagster import Definitions

from resources.lake import lake, participants_lake
from resources.postgres import LedgerResource, ledger
from resources.spark import spark

RESOURCES = {"lake": lake, "spark": spark, "ledger": ledger, "participants_lake": participants_lake}

defs = Definitions(resources=RESOURCES)

__all__ = ["RESOURCES", "LedgerResource", "defs", "lake", "ledger", "participants_lake", "spark"]
