"""Tailers: named, durable read positions on one queue partition.

A tailer's ``position`` is the next offset it will read. Reads advance it in memory; ``commit()``
makes it durable (so a consumer picks at-least-once or at-most-once by when it commits, as in
Kafka). A new Tailer with the same name starts from the last committed position (the partition's start
offset if none).

Retention (``retention.py``) never removes rows a tailer's committed position still needs,
unless the tailer is *expendable* (declared with every commit): then retention moves its
committed position to the new start, and the tailer, on its next read, moves its own position
there too and adds the offsets it lost to :attr:`Tailer.retained_away` (and logs a warning). A
tailer that is not expendable whose position is below the start (it seeked there) raises
:class:`OffsetOutOfRangeError`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from cues_platform.queues.errors import OffsetOutOfRangeError, PositionRangeError, ReadTimeoutError
from cues_platform.queues.names import validate_name
from cues_platform.queues.positions import PositionStore
from cues_platform.queues.reader import Isolation, ReadPlan, execute_arrow, execute_spark, plan_read
from cues_platform.queues.schema import (
    InvalidRangeError,
    argument_error,
    check_choice,
    check_int,
    check_seconds,
    is_integer,
)

if TYPE_CHECKING:
    from cues_platform.queues.handle import QueueHandle

log = logging.getLogger(__name__)


class Tailer:
    def __init__(
        self,
        *,
        queue: QueueHandle,
        name: str,
        partition: str,
        isolation: Isolation | str = Isolation.READ_COMMITTED,
        expendable: bool = False,
    ) -> None:
        if not isinstance(expendable, bool):
            raise argument_error("Queue.tailer", "expendable", expendable, "not a bool",
                                 "True or False", queue=queue.name)
        self.queue = queue
        self.expendable = expendable
        self.retained_away = 0  # offsets this tailer skipped because retention removed them
        self.name = validate_name(name, kind="tailer")
        self.partition = queue.check_partition(partition)
        self.isolation = check_choice(isolation, Isolation, call="Queue.tailer",
                                      argument="isolation", queue=queue.name)
        self._store = PositionStore(queue.lake)
        committed = self._store.get(queue=queue.name, tailer=self.name, partition=partition)
        self.position = queue.start_offset(partition) if committed is None else committed
        self._unblock = threading.Event()

    def __repr__(self) -> str:
        return (
            f"Tailer({self.queue.name!r}/{self.partition}, {self.name!r}, position={self.position})"
        )

    # -- positions ----------------------------------------------------------------------------------
    def committed_position(self) -> int:
        """The durable position (the partition's start offset when nothing was committed)."""
        committed = self._store.get(queue=self.queue.name, tailer=self.name,
                                    partition=self.partition)
        return self.queue.start_offset(self.partition) if committed is None else committed

    def commit(self, position: int | None = None) -> int:
        """Make ``position`` (default: the current one) durable and return it.

        A position outside ``[0, next offset]`` of the partition raises
        :class:`PositionRangeError` (a position past the end would make the tailer skip every
        message written until the partition catches up)."""
        end = self.queue.next_offset(self.partition)
        first = self.queue.start_offset(self.partition)
        if position is None and self.expendable and self.position < first:
            self.retained_away += first - self.position  # retention passed it: caught up
            self.position = first
        pos = self.position if position is None else position
        if is_integer(pos) and 0 <= pos < first:
            raise OffsetOutOfRangeError(
                f"tailer {self.name!r} on {self.queue.name}/{self.partition} cannot commit position "
                f"{pos}: it is below the partition's start offset {first} (retention removed the "
                f"rows before it); commit a position in [{first}, {end}]",
                queue=self.queue.name, tailer=self.name, partition=self.partition, offset=pos,
                start_offset=first)
        if not is_integer(pos) or not 0 <= pos <= end:
            raise PositionRangeError(
                f"tailer {self.name!r} on {self.queue.name}/{self.partition} cannot commit position "
                f"{pos!r}: a position is an offset in [0, {end}] (0 = from the start, {end} = after "
                "the last message); seek or read to a valid offset and commit again",
                queue=self.queue.name, tailer=self.name, partition=self.partition,
                position=pos, offset=pos, valid=(0, end))
        pos = int(pos)  # a NumPy integer is an offset too
        self._store.commit(
            queue=self.queue.name, tailer=self.name, partition=self.partition, position=pos,
            expendable=self.expendable,
        )
        return pos

    def seek(self, where: int | Literal["start", "end"]) -> int:
        """Move to an offset, to the start, or past the last message; returns the new position."""
        end = self.queue.next_offset(self.partition)
        first = self.queue.start_offset(self.partition)
        if where == "start":
            self.position = first
        elif where == "end":
            self.position = end
        elif is_integer(where) and 0 <= where < first:
            raise OffsetOutOfRangeError(
                f"Tailer.seek ({self.name!r} on {self.queue.name}/{self.partition}): offset {where} "
                f"is below the partition's start offset {first} (retention removed the rows "
                f"before it); seek to 'start' or an offset in [{first}, {end}]",
                queue=self.queue.name, partition=self.partition, offset=where, start_offset=first)
        elif is_integer(where) and first <= where <= end:
            self.position = int(where)
        else:
            raise argument_error(
                f"Tailer.seek ({self.name!r} on {self.queue.name}/{self.partition})", "where", where,
                "not a position", f"'start', 'end' or an offset in [{first}, {end}]",
                queue=self.queue.name, error=InvalidRangeError, partition=self.partition,
                offset=where)
        return self.position

    def last_offset(self) -> int | None:
        return self.queue.last_offset(self.partition)

    def lag(self) -> int:
        return self.queue.next_offset(self.partition) - self.position

    # -- reads -------------------------------------------------------------------------------------
    def plan(self, max_messages: int, *, call: str = "Tailer.read_arrow") -> ReadPlan:
        count = check_int(max_messages, call=call, argument="max_messages", minimum=1,
                          queue=self.queue.name, error=InvalidRangeError,
                          expected="an int >= 1 (the most messages to read)")
        # one snapshot for the start offset and the plan: a retention committing between two
        # looks must not put the position below the start the plan sees
        snapshot = self.queue.refresh()
        first = self.queue.start_offset(self.partition, snapshot=snapshot)
        if self.position < first and self.expendable:
            lost = first - self.position
            log.warning("tailer %r on %s/%s: retention removed offsets [%d, %d) before it read "
                        "them (it is expendable); it goes on from %d", self.name, self.queue.name,
                        self.partition, self.position, first, first)
            self.retained_away += lost
            self.position = first
        return plan_read(
            self.queue,
            partition=self.partition,
            start=self.position,
            end=self.position + count,
            isolation=self.isolation,
            call=call,
            snapshot=snapshot,
        )

    def read_arrow(self, max_messages: int = 1000) -> pa.Table:
        """The next up to ``max_messages`` messages; advances the position past them."""
        plan = self.plan(max_messages)
        table = execute_arrow(self.queue, plan)
        self.position = plan.end
        return table

    def read_spark(self, spark: Any, max_messages: int = 100_000) -> Any:
        """Like :meth:`read_arrow` but as a Spark DataFrame read from the Parquet files."""
        plan = self.plan(max_messages, call="Tailer.read_spark")
        frame = execute_spark(self.queue, spark, plan)
        self.position = plan.end
        return frame

    def read_blocking(
        self, max_messages: int = 1000, *, timeout: float | None = None, poll_interval: float = 0.05
    ) -> pa.Table:
        """Wait until a message is readable, then read like :meth:`read_arrow`.

        Raises :class:`ReadTimeoutError` after ``timeout`` seconds; returns an empty table at once
        when another thread calls :meth:`unblock`.
        """
        call = "Tailer.read_blocking"
        self.plan(max_messages, call=call)  # checks max_messages before waiting
        timeout = check_seconds(timeout, call=call, argument="timeout", optional=True,
                                queue=self.queue.name)
        poll_interval = check_seconds(poll_interval, call=call, argument="poll_interval",
                                      positive=True, queue=self.queue.name)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = min(0.005, poll_interval)
        while True:
            plan = self.plan(max_messages, call=call)
            if not plan.empty:
                table = execute_arrow(self.queue, plan)
                self.position = plan.end
                return table
            if self._unblock.is_set():
                self._unblock.clear()  # one unblock releases one read
                return self.queue.table_schema.empty_table()
            if deadline is not None and time.monotonic() >= deadline:
                raise ReadTimeoutError(
                    f"no message on {self.queue.name}/{self.partition} after offset "
                    f"{self.position - 1} within {timeout}s",
                    queue=self.queue.name,
                    partition=self.partition,
                    offset=self.position,
                )
            wait = delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic()))
            self._unblock.wait(wait)
            delay = min(delay * 2, poll_interval)

    def unblock(self) -> None:
        """Make the current (or, if none is blocked, the next) :meth:`read_blocking` return an
        empty table at once. Thread-safe."""
        self._unblock.set()

    def read_backward(self, count: int) -> pa.Table:
        """The ``count`` messages before the position, newest first; the position does not move."""
        count = check_int(count, call="Tailer.read_backward", argument="count",
                          queue=self.queue.name, error=InvalidRangeError,
                          expected="an int >= 0 (how many messages before the position)")
        snapshot = self.queue.refresh()  # the start offset and the plan from one snapshot
        start = max(self.queue.start_offset(self.partition, snapshot=snapshot), self.position - count)
        plan = plan_read(
            self.queue,
            partition=self.partition,
            start=start,
            end=self.position,
            isolation=self.isolation,
            call="Tailer.read_backward",
            snapshot=snapshot,
        )
        table = execute_arrow(self.queue, plan)
        return (
            table.take(pa.array(range(table.num_rows - 1, -1, -1), pa.int64()))
            if table.num_rows
            else table
        )
