"""The reference pipeline's assets; each module contributes its own definitions."""

from dagster import Definitions

from assets.queue_demo import defs as queue_demo_defs

defs = Definitions.merge(queue_demo_defs)
