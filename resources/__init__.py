"""The reference deployment's resources; each module contributes its own definitions."""

from dagster import Definitions

from resources.lake import defs as lake_defs

defs = Definitions.merge(lake_defs)
