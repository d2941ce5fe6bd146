"""The postings protocol of seed 002: participants with their own PostgreSQL, exchanging postings
and results over the platform queues POSTINGS (subject: receiver) and RESULTS (subject: sender).

See docs/postings-protocol.md. Modules in floors, bottom first; each module imports only modules
listed before it:

1. ``errors``; ``config`` (settings sources); ``ids`` (the participant id rule); ``model``
   (statuses, schemas, settings); ``db`` (connections, migrations); ``loop`` (the run loop);
2. ``leases`` (instance leases); ``network`` (queues and registry); ``trail`` (audit rows,
   consistency issues); ``slots`` (slot names, producer ids, bail backoff, the ``ProducerSide``
   view of an instance);
3. ``postings`` (step 1: record); ``publications`` (steps 2, 4, 5 in the database); ``replay``
   (start-up replay); ``results`` (step 6: apply results, who published them); ``history``;
4. ``producer`` (the producer instance: the critical section, step 3); ``consumer``
   (exactly-once processing); ``checks`` (consistency and completeness);
5. ``once`` (one bounded pass, what the Dagster assets run); ``supervise``; ``instance``
   (process entry point); ``cli`` (the ``cues participant`` commands).
"""

from cues_platform.participants.model import AckStatus, ProcessingStatus, Role, Settings

__all__ = ["AckStatus", "ProcessingStatus", "Role", "Settings"]
