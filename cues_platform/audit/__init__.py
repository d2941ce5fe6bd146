"""The auditor: proves (or disproves) exactly-once delivery from what is in the lake.

Nothing but the lake is trusted: every exactly-once processor is found from its backing queue
(``{root}/_cues/backing/{processor}``), every output queue from the attempts that name it, and the
checks compare the backing records with the ``_delivery_hash`` / ``_partition`` / ``_offset``
columns of the queues (read as Arrow with column projection, vectorized: millions of rows are
fine). The checks (violation kinds in brackets), one module each:

1. Input coverage and positions (:mod:`.coverage`, :mod:`.positions`): per processor in step
   order and per (queue, partition), each step starts where the previous read ended; a first read
   starts at 0 or where another lane of the family ended; no lane reads another lane's own
   partition from 0; a stored position is explained by the history ([gap], [overlap],
   [position]); no step reads offsets the input does not have ([beyond_end]). A delivered step is
   an attempt whose commits are all present (rows with its hash in every queue it names); a nil
   attempt is delivered by its record. A trailing snapshot without an attempt, or a last attempt
   whose commits are not all there yet, is *pending* (recovery finishes it); input offsets after
   the last delivered step are *lag*. Neither is a violation.
2. Attribution (:mod:`.attribution`): every row with a delivery hash in a queue that an
   exactly-once processor writes carries the hash of an attempt of some processor
   ([unknown_hash]) and lands in a queue and partition that attempt names
   ([unexpected_output]); a row *without* a hash in such a queue was written outside the
   protocol ([no_delivery_hash]). Error rows that name a processor without a backing queue
   (at-least/at-most-once) are listed as not audited.
3. Once only (:mod:`.once`): for each (queue, partition, hash) the rows equal the attempt's
   recorded count ([delivered_twice] when more, [row_count_mismatch] when fewer) and form one
   contiguous offset range ([not_contiguous]); an attempt followed by later steps has all its
   commits ([undelivered]); each queue's app transaction ``proc:{processor}`` agrees with the
   steps whose rows it holds ([app_transaction]); a queue an attempt names exists
   ([missing_queue]).
4. The backing queue itself (:mod:`.sequence`, :mod:`.backing`, :mod:`.trust`): steps numbered
   0, 1, 2, ... each with one snapshot then one attempt of the same hash ([step_sequence]);
   records that do not parse ([malformed_record]); alts snapshots read only the chosen binding
   ([alts_not_empty]); staged files an attempt names are in its step's staging folder
   ([outside_lake]); a step that read nothing produced no rows ([rows_without_input]).
5. Storage (:mod:`.storage`): every queue and backing table opens and reads ([unreadable]: a
   truncated commit, a missing data file, a folder with data and no log); its log is whole and
   agrees with its files ([corrupt_log]: an empty or unparsable commit, a ``part:`` app
   transaction that disagrees with the files); every data file its log names is inside its
   folder ([outside_lake]). An audit fails on what it cannot read.
6. Failures (:mod:`.failures`): no error row was written by a platform failure
   ([platform_error]: its ``exception_type`` is Delta's, the file system's, Py4J/Spark's or
   cues_platform's own, so the step's input never reached its outputs).
7. Error rows and replays (:mod:`.isolated`): every error row a step committed names that step
   ([error_row_step]) and either the step's ranges or the step's ranges with one binding
   narrowed to one offset inside it (isolation), readable ([error_row_inputs]), each input row
   in the step's error rows once ([error_row_twice]); every replay step (``Snapshot.replay``)
   replays an error row that is there ([replay_missing]; [replay_unverifiable] when it cannot be
   read; a row retention removed is counted, not failed), of its own lane, with its inputs, not
   a contract break ([replay_mismatch]), once ([replayed_twice]). Replay steps re-read old ranges
   on purpose: step 1's positions rules skip them. The summary counts each processor's error
   rows, replayed and pending. What is NOT proven: that an isolated row's output is absent from
   the delivered rows (a general map's rows do not carry their source offset).

Retention (:mod:`.retained`): a partition's start offset (``start:{partition}``) says which
rows were removed on purpose. Every partition holds exactly ``[start, next)`` (step 5, else
[corrupt_log] naming the offsets); rows below the start are retained-away, never a gap or lost
output; a step whose output rows are below the start is delivered when its commit is proven or
its order and the start's row count allow it, and the report counts what was only checked
structurally (``AuditReport.retained_below``, ``retained_steps``).

Reading is ordered so that a lake being written while it is audited gives no false alarm: the
backing queues are read first, then the queues; hashes of attempts appended in between are
recognized (from a second read of the backing tails) but their steps are left to the next audit.
The report is :class:`AuditReport` (:mod:`.report`); :func:`describe_backing` puts a backing
queue in words (:mod:`.describe`).
"""

from __future__ import annotations

from cues_platform.audit.core import audit
from cues_platform.audit.describe import describe_backing
from cues_platform.audit.discovery import backing_processors, check_lake
from cues_platform.audit.errors import (
    AuditError,
    LakeNotFoundError,
    NoSuchProcessorError,
    UnreadableTableError,
)
from cues_platform.audit.report import (
    KINDS,
    AuditReport,
    InputLag,
    ProcessorSummary,
    Violation,
)
from cues_platform.audit.storage import open_checked, unreadable_error

__all__ = [
    "KINDS",
    "AuditError",
    "AuditReport",
    "InputLag",
    "LakeNotFoundError",
    "NoSuchProcessorError",
    "ProcessorSummary",
    "UnreadableTableError",
    "Violation",
    "audit",
    "backing_processors",
    "check_lake",
    "describe_backing",
    "open_checked",
    "unreadable_error",
]
