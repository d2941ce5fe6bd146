"""The Dagster code location of the reference deployment: one root merges assets/ and resources/.

Runs execute in process (one run = one process = one Spark session, reused by every processor
asset of the run); Dagster's default multiprocess executor would start a Spark per asset step.
"""

from dagster import Definitions, in_process_executor

from assets import defs as asset_defs
from resources import defs as resource_defs

defs = Definitions.merge(asset_defs, resource_defs, Definitions(executor=in_process_executor))
