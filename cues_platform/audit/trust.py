"""What a record claims, checked against the lake (issue 22 item 7): the records are data, and a
damaged or forged one must fail the audit, not pass it.

- [outside_lake]: every staged file that an attempt recovery may still read (not delivered yet)
  names is a file of the staging folder of that attempt's own step in *this* lake
  (:func:`cues_platform.processing.outputs.confine_staged`, the check recovery makes before it
  reads one). A delivered attempt's files were removed after its commit and are never read
  again: its record may name the lake's earlier location (a lake moved or restored elsewhere)
  and is checked only on request (``shape_of_delivered``: a file of a step folder
  ``.../_cues/staging/{p}/{step}-{hash8}/`` of any root, the layout every version wrote; test
  fixtures of older protocols name placeholders). The data files a table's Delta log names are
  checked by :mod:`.storage`.
- [rows_without_input]: a step that read no input offset produced no row. Every snapshot the
  protocol plans reads at least one offset (map, join, fork and sink steps wait until every input
  has data; an alts step reads its chosen binding; a source has no inputs and no backing queue),
  and a function with no input rows has nothing to map, filter or explode: an attempt whose
  inputs are all empty and that records rows, or whose hash is on rows of any queue, did not
  come from a step. (A map may write any number of rows from n >= 1 inputs, so no bound is
  checked beyond zero.) That a step's rows carry its own hash is step 2 (attribution).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cues_platform.audit.backing import record_rows
from cues_platform.audit.report import OUTSIDE_LAKE, ROWS_WITHOUT_INPUT, Violation
from cues_platform.audit.rows import QueueRows
from cues_platform.processing.backing import Record
from cues_platform.processing.outputs import STAGING_MARK, confine_staged
from cues_platform.queues import Lake
from cues_platform.queues.confine import PathOutsideLakeError


def staged_file_checks(lake: Lake, pid: str, attempts: Iterable[Record],
                       delivered: Iterable[Record] = (), *, shape_of_delivered: bool = False
                       ) -> list[Violation]:
    """[outside_lake] for every staged file an attempt that is not one of ``delivered`` names
    outside its step's staging folder in this lake (``shape_of_delivered``: and every file a
    delivered attempt names that is not a file of a folder ``.../_cues/staging/{p}/{step}-{h8}``
    of any lake root)."""
    bad: list[Violation] = []
    done = {rec.hash for rec in delivered}
    for rec in attempts:
        if rec.hash in done and not shape_of_delivered:
            continue
        files = rec.outputs.get("files") or {}
        if not isinstance(files, Mapping):
            continue
        for queue, parts in sorted(files.items()):
            for part, uri in sorted((parts or {}).items()):
                try:
                    if rec.hash in done:
                        _staged_shape(uri, rec)
                    else:
                        confine_staged(uri, lake=lake, snapshot=rec.snapshot, queue=queue,
                                       partition=part)
                except PathOutsideLakeError as exc:
                    bad.append(Violation(
                        OUTSIDE_LAKE,
                        f"the attempt of step {rec.step} ({_where(rec)}) names staged file {uri!r} "
                        f"for {queue}/{part}, which is not in its step's staging folder "
                        f"({exc.reason}): recovery refuses to read it; the record is damaged or "
                        "forged",
                        processor=pid, queue=queue, partition=part, step=rec.step, hash=rec.hash,
                        file=str(uri),
                    ))  # fmt: skip
    return bad


def _staged_shape(uri: object, rec: Record) -> None:
    """Raise :class:`PathOutsideLakeError` unless ``uri`` names a file directly in the staging
    folder of ``rec``'s step, in whatever lake root precedes it."""
    snap = rec.snapshot
    folder = f"{STAGING_MARK}{snap.processor}/{snap.step:012d}-{snap.delivery_hash[:8]}/"
    text = uri if isinstance(uri, str) else ""
    root, found, name = text.partition(folder)
    if found and root and name and "/" not in name and name not in (".", "..") and not any(
        s in (".", "..") for s in root.split("/")
    ):
        return
    raise PathOutsideLakeError(f"{uri!r} is not a staged file of step {snap.step}", path=uri,
                               reason=f"it is not a file directly in a folder .../{folder.strip('/')}")


def rows_without_input(pid: str, attempts: Iterable[Record],
                       rows: Mapping[str, QueueRows]) -> list[Violation]:
    """[rows_without_input] for every attempt that read nothing and produced rows."""
    bad: list[Violation] = []
    for rec in attempts:
        snap = rec.snapshot
        if not snap.inputs or any(r.size > 0 for r in snap.inputs.values()):
            continue
        recorded = {f"{q}/{p}": n for q, parts in record_rows(rec).items() for p, n in parts.items() if n}
        present = sorted(name for name, qr in rows.items() if rec.hash in qr.hashes)
        if not recorded and not present:
            continue
        reads = ", ".join(f"{r.queue}/{r.partition} [{r.start}, {r.end})"
                          for _, r in sorted(snap.inputs.items()))
        what = []
        if recorded:
            what.append("its attempt records rows for " + ", ".join(sorted(recorded)))
        if present:
            what.append("rows with its hash are in " + ", ".join(present))
        first = next(iter(sorted(record_rows(rec))), None)
        bad.append(Violation(
            ROWS_WITHOUT_INPUT,
            f"step {rec.step} ({_where(rec)}) read no input offset ({reads}) yet "
            f"{' and '.join(what)}: no step of the protocol produces rows from nothing; the "
            "record is damaged or forged",
            processor=pid, queue=first, step=rec.step, hash=rec.hash,
        ))  # fmt: skip
    return bad


def _where(rec: Record) -> str:
    if rec.version is not None:
        return f"home commit {rec.version}"
    return f"backing offset {rec.offset}"
