"""The postings protocol of seed 002: participants with their own PostgreSQL, exchanging postings
and results over the platform queues POSTINGS (subject: receiver) and RESULTS (subject: sender).

See docs/postings-protocol.md. Modules: ``model`` (statuses, schemas, settings), ``db``
(connections, migrations), ``leases`` (instance leases), ``network`` (queues and registry),
``producer`` (record/publish/results), ``replay`` (start-up replay), ``consumer`` (exactly-once
processing), ``checks`` (consistency and completeness), ``instance`` (process entry point),
``once`` (one bounded pass, what the Dagster assets run),
``cli`` (the ``cues participant`` commands).
"""

from cues_platform.participants.model import AckStatus, ProcessingStatus, Role, Settings

__all__ = ["AckStatus", "ProcessingStatus", "Role", "Settings"]
