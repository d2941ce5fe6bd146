"""The Dagster code location of the reference deployment: one root merges assets/ and resources/.

Runs execute in process (one run = one process = one Spark session, reused by every processor
asset of the run); Dagster's default multiprocess executor would start a Spark per asset step.
Only ``defs`` is a ``Definitions`` at module scope (Dagster's loader insists on one).
"""

from dagster import Definitions, in_process_executor

import assets
import resources

defs = Definitions.merge(assets.defs, resources.defs, Definitions(executor=in_process_executor))
