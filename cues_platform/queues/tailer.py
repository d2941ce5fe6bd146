"""Tailers: named, durable read positions on one queue partition.

A tailer's ``position`` is the next offset it will read. Reads advance it in memory; ``commit()``
makes it durable (so a consumer picks at-least-once or at-most-once by when it commits, as in
Kafka). A new Tailer with the same name starts from the last committed position (0 if none).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from cues_platform.queues.errors import PositionRangeError, ReadTimeoutError
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
    from cues_platform.queues.queue import Queue


class Tailer:
    def __init__(
        self,
        *,
        queue: Queue,
        name: str,
        partition: str,
        isolation: Isolation | str = Isolation.READ_COMMITTED,
    ) -> None:
        self.queue = queue
        self.name = validate_name(name, kind="tailer")
        self.partition = queue.check_partition(partition)
        self.isolation = check_choice(isolation, Isolation, call="Queue.tailer",
                                      argument="isolation", queue=queue.name)
        self._store = PositionStore(queue.lake)
        committed = self._store.get(queue=queue.name, tailer=self.name, partition=partition)
        self.position = committed or 0
        self._unblock = threading.Event()

    def __repr__(self) -> str:
        return (
            f"Tailer({self.queue.name!r}/{self.partition}, {self.name!r}, position={self.position})"
        )

    # -- positions ----------------------------------------------------------------------------------
    def committed_position(self) -> int:
        return (
            self._store.get(queue=self.queue.name, tailer=self.name, partition=self.partition) or 0
        )

    def commit(self, position: int | None = None) -> int:
        """Make ``position`` (default: the current one) durable and return it.

        A position outside ``[0, next offset]`` of the partition raises
        :class:`PositionRangeError` (a position past the end would make the tailer skip every
        message written until the partition catches up)."""
        pos = self.position if position is None else position
        end = self.queue.next_offset(self.partition)
        if not is_integer(pos) or not 0 <= pos <= end:
            raise PositionRangeError(
                f"tailer {self.name!r} on {self.queue.name}/{self.partition} cannot commit position "
                f"{pos!r}: a position is an offset in [0, {end}] (0 = from the start, {end} = after "
                "the last message); seek or read to a valid offset and commit again",
                queue=self.queue.name, tailer=self.name, partition=self.partition,
                position=pos, offset=pos, valid=(0, end))
        pos = int(pos)  # a NumPy integer is an offset too
        self._store.commit(
            queue=self.queue.name, tailer=self.name, partition=self.partition, position=pos
        )
        return pos

    def seek(self, where: int | Literal["start", "end"]) -> int:
        """Move to an offset, to the start, or past the last message; returns the new position."""
        end = self.queue.next_offset(self.partition)
        if where == "start":
            self.position = 0
        elif where == "end":
            self.position = end
        elif is_integer(where) and 0 <= where <= end:
            self.position = int(where)
        else:
            raise argument_error(
                f"Tailer.seek ({self.name!r} on {self.queue.name}/{self.partition})", "where", where,
                "not a position", f"'start', 'end' or an offset in [0, {end}]",
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
        return plan_read(
            self.queue,
            partition=self.partition,
            start=self.position,
            end=self.position + count,
            isolation=self.isolation,
            call=call,
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
        start = max(0, self.position - count)
        plan = plan_read(
            self.queue,
            partition=self.partition,
            start=start,
            end=self.position,
            isolation=self.isolation,
            call="Tailer.read_backward",
        )
        table = execute_arrow(self.queue, plan)
        return (
            table.take(pa.array(range(table.num_rows - 1, -1, -1), pa.int64()))
            if table.num_rows
            else table
        )
