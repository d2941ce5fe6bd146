"""Create a Delta table exactly once, however many processes race to create it.

delta-rs writes a table's first commit with put-if-absent, but when that commit loses the race
for version 0 its conflict checker may *rebase* it: the loser's CREATE TABLE lands as version 1
and replaces the winner's metadata (its table id, its properties, even its schema). Measured on
delta-rs 1.x with 8 threads creating one table: two "successful" creators in 6 rounds of 10.
A queue's partitions and schema live in that metadata, so a rebased create could silently
re-declare a queue someone is already writing.

Contract of :func:`create_table_once` on a local lake:

1. Write the whole table (its version-0 commit) into a private staging folder under
   ``{lake}/_cues/creating/`` (never among the queues or backing queues, which the auditor and
   the Jepsen checker list: a creator killed while removing its staging folder once left a
   half-removed table there that they took for a damaged queue).
2. Point the commit's recorded location at the target.
3. Hard-link that commit as ``<target>/_delta_log/00000000000000000000.json``. ``link`` fails when
   the name exists, so exactly one creator's commit becomes version 0 and nobody's becomes
   version 1. The loser gets ``False`` and opens the winner's table.
4. Remove the staging folder (a crash before this leaves only a folder under ``_cues/creating``).

On a crash between the steps the target holds either nothing (steps 1-2: the create can be run
again) or the complete version 0 (step 3 is one atomic ``link``).

Remote lakes (object stores, where pyarrow has no put-if-absent) use delta-rs directly and then
verify that version 0 is their own commit; a lost race whose commit was rebased raises
:class:`ConcurrentCreateError` naming the table, rather than passing as a success.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import DeltaError

from cues_platform.queues.errors import ConcurrentCreateError


class Location(Protocol):
    """What creating a table needs of a lake (``location.LakeLocation`` is one)."""

    root: str

    @property
    def is_local(self) -> bool: ...

    @property
    def options(self) -> dict[str, str] | None: ...

    def local_path(self, uri: str) -> Path: ...

    def system_uri(self, *parts: str) -> str: ...

CREATOR_KEY = "cues.creator"
FIRST_COMMIT = "00000000000000000000.json"


def create_table_once(
    lake: Location, uri: str, schema: pa.Schema, *, what: str, **create: Any
) -> bool:
    """Create the Delta table at ``uri``; False if another creator's table is there instead.

    ``create`` holds :meth:`deltalake.DeltaTable.create`'s keyword arguments (not ``mode``).
    DeltaError from delta-rs itself (a bad property, a storage fault) propagates.
    """
    if lake.is_local:
        return _create_local(lake.local_path(uri), _staging_root(lake, lake.local_path(uri)), schema,
                             options=lake.options, **create)
    token = uuid.uuid4().hex
    try:
        DeltaTable.create(uri, schema, mode="error", storage_options=lake.options,
                          commit_properties=CommitProperties(custom_metadata={CREATOR_KEY: token}),
                          **create)
    except DeltaError:
        if DeltaTable.is_deltatable(uri, storage_options=lake.options):
            return False
        raise
    first = DeltaTable(uri, version=0, storage_options=lake.options).history(1)
    if first and first[0].get(CREATOR_KEY) not in (None, token):
        raise ConcurrentCreateError(
            f"{what} at {uri} was created by two processes at once and delta-rs committed both; "
            "its definition is the last creator's: check it with `cues queue show` and drop "
            "and recreate it if it is not the intended one", uri=uri)
    return True


def _staging_root(lake: Location, target: Path) -> Path:
    """``{lake}/_cues/creating``: a folder no lister of queues or backing queues looks into (a
    half-removed staging table there is never taken for a damaged queue). A table outside the
    lake's root stages beside itself, on its own file system (a hard link cannot cross one)."""
    root = lake.local_path(lake.root)
    if target.resolve().is_relative_to(root.resolve()):
        return lake.local_path(lake.system_uri("creating"))
    return target.parent


def _create_local(
    target: Path, staging_root: Path, schema: pa.Schema, *, options: Mapping[str, str] | None,
    **create: Any,
) -> bool:
    staging_root.mkdir(parents=True, exist_ok=True)
    staging = staging_root / f".{target.name}.creating-{uuid.uuid4().hex}"
    try:
        # Step 1
        DeltaTable.create(str(staging), schema, mode="error", storage_options=options, **create)
        commit = staging / "_delta_log" / FIRST_COMMIT
        # Step 2
        commit.write_text(_relocated(commit.read_text(), target))
        # Step 3
        log = target / "_delta_log"
        log.mkdir(parents=True, exist_ok=True)
        try:
            os.link(commit, log / FIRST_COMMIT)
        except FileExistsError:
            return False
        return True
    finally:
        # Step 4
        shutil.rmtree(staging, ignore_errors=True)


def _relocated(text: str, target: Path) -> str:
    """The commit entry with its commitInfo's ``location`` naming the target, not the staging."""
    lines = []
    for line in text.splitlines():
        action = json.loads(line)
        params = action.get("commitInfo", {}).get("operationParameters")
        if isinstance(params, dict) and "location" in params:
            params["location"] = target.as_uri() + "/"
        lines.append(json.dumps(action, separators=(",", ":")))
    return "\n".join(lines) + "\n"
