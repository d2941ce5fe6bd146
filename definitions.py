"""The Dagster code location of the reference deployment: one root merges assets/ and resources/."""

from dagster import Definitions

from assets import defs as asset_defs
from resources import defs as resource_defs

defs = Definitions.merge(asset_defs, resource_defs)
