"""What one Delta version of a queue says, read once: app-transaction versions and add actions.

delta-rs answers ``DeltaTable.transaction_version`` by replaying the log since the last
checkpoint on every call (measured: 0.5-2 ms per call, growing with the commits since the
checkpoint), and ``get_add_actions`` by building a new Arrow table. A step asks both several
times of the same version (plan, read, commit guard, offsets), and the input queues of a
processor usually do not move between two steps. A Delta version is immutable, so what it says
can be kept: this cache maps ``(table id, version)`` to the answers already read.

Two rules keep it exact:

1. The key includes the table's id (``metaData.id``, new for every table created), so a queue
   deleted and created again at the same path never answers from the old table's entries.
2. :meth:`SnapshotCache.committed` seeds version ``v + 1`` from version ``v`` only when the
   caller's own commit is exactly ``v + 1`` (no other commit between) and the table expires no
   app transactions (``delta.setTransactionRetentionDuration`` unset): then ``v + 1``'s app
   transactions are ``v``'s overwritten by the commit's own. Otherwise ``v + 1`` is read lazily
   like any version.

3. With that retention set, an app id that may expire (``layout.expires``: ``prod:``,
   ``pepoch:``, ``txn:``) is never answered from the cache: delta-rs drops an expired entry when
   it loads a snapshot, measured against the time of the load, so what one version says of it
   changes with time. Ids that never expire (``part:``, ``proc:``...) are cached as before.

Only the newest two versions are kept (a handle moves forward; older snapshots are rare).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from cues_platform.queues.layout import TXN_RETENTION_KEY as RETENTION_KEY
from cues_platform.queues.layout import expires

_ABSENT = -1  # stored for an app id the version does not have (versions are >= 0)
_KEEP = 2


class SnapshotCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._txns: dict[tuple[str, int], dict[str, int]] = {}
        self._actions: dict[tuple[str, int], pa.Table] = {}

    @staticmethod
    def key(dt: DeltaTable) -> tuple[str, int]:
        return dt.metadata().id, dt.version()

    def transaction_version(self, dt: DeltaTable, app_id: str) -> int | None:
        if expires(app_id) and RETENTION_KEY in dt.metadata().configuration:  # rule 3
            v = dt.transaction_version(app_id)
            return None if v is None else int(v)
        key = self.key(dt)
        with self._lock:
            known = self._txns.get(key, {}).get(app_id)
        if known is None:
            v = dt.transaction_version(app_id)
            known = _ABSENT if v is None else int(v)
            with self._lock:
                self._entry(self._txns, key)[app_id] = known
        return None if known == _ABSENT else known

    def add_actions(self, dt: DeltaTable) -> pa.Table:
        key = self.key(dt)
        with self._lock:
            table = self._actions.get(key)
        if table is None:
            table = pa.table(dt.get_add_actions(flatten=True))
            with self._lock:
                self._actions[key] = table
                self._trim(self._actions)
        return table

    def committed(self, dt: DeltaTable, *, before: tuple[str, int],
                  txns: Iterable[tuple[str, int]]) -> None:
        """``dt`` has just committed (and moved to its new version) on top of version ``before``
        with the app transactions ``txns``: seed the new version per rule 2."""
        key = self.key(dt)
        if key != (before[0], before[1] + 1) or RETENTION_KEY in dt.metadata().configuration:
            return
        with self._lock:
            seeded = dict(self._txns.get(before, {}))
            seeded.update({app: int(v) for app, v in txns})
            self._entry(self._txns, key).update(seeded)

    def _entry(self, store: dict[tuple[str, int], Any], key: tuple[str, int]) -> dict[str, int]:
        entry = store.setdefault(key, {})
        self._trim(store)
        return entry

    @staticmethod
    def _trim(store: dict[tuple[str, int], Any]) -> None:
        for old in sorted(store, key=lambda k: k[1])[:-_KEEP]:
            del store[old]
