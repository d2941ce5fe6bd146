"""The reference pipeline: payments postings (graph, traffic generator, ledger, report, main job)."""

from cues_platform.reference.generator import Traffic, TrafficSpec, generate
from cues_platform.reference.ledger import LedgerDB
from cues_platform.reference.pipeline import GRAPH_NAME, payments_graph
from cues_platform.reference.report import settlement_report

__all__ = ["GRAPH_NAME", "LedgerDB", "Traffic", "TrafficSpec", "generate", "payments_graph",
           "settlement_report"]
