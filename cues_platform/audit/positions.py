"""Step 1 of the audit, positions: every input offset a family of lanes reads is read once, in
order, and no position is carried to a partition it was not read from.

The rules, over the *delivered* steps of every exactly-once processor (those with a backing queue;
at-least/at-most-once processors keep no step history and are not audited), on every (queue,
partition) a step's snapshot reads. An alts step's non-chosen bindings are empty ranges
``[position, position)``: they count, since they record where the position stood. A *family* is a
processor and its lanes (``p``, ``p.x``: :func:`cues_platform.processing.lanes.family_of`); a
lane's *own partition* is the part of its id after the dot (``"0"`` for ``p`` itself).

R1. Within one processor id, in step order: a step's range on (q, part) starts exactly where the
    previous step of that processor on (q, part) ended. A later start skipped offsets ([gap]), an
    earlier one reads offsets again ([overlap]).
R2. The first step of a processor on (q, part) starts at 0, at or below the partition's start
    offset when no family lane read it before (a lane deployed after retention removed rows
    starts at the start offset: the offsets below it are retained-away, :mod:`.retained`), or
    exactly where another lane of its family ended (q, part) for good: a redeployment
    that handed (q, part) from lane ``p.x`` to lane ``p`` (the *predecessor*'s last read ends
    where the successor's first begins). A first start that no family lane ended at is a gap
    (from the highest family end below it, or 0) or, when a family lane read past it, an
    overlap (a gap never includes offsets below the start that no family lane read: those
    are retained-away). This catches issue 22's reproduction: ``p.x`` read a/x [0, 10), ``p`` was redeployed
    onto a/x and started at 30 (partition 0's position): gap [10, 30); or ``p.x`` ended at 30 and
    ``p`` started at 10: overlap [10, 30).
R3. Exclusive partitions: when two or more lanes of a family read a binding each at its own
    partition (an every-partition binding ``In(q)``), partition ``part`` of ``q`` belongs to the
    lane whose own partition is ``part``. Another lane of the family that also reads it from
    the beginning (offset 0, or the start offset with no lane before it) delivers the owner's
    offsets again ([overlap]). A side input that every lane reads
    in full (``In("rates", "0")``: each lane its own position) is not exclusive: only one lane
    reads it at its own partition, so any number of lanes may read it from 0.
R4. Stored positions: the home queue's ``pos:{p}:{q}/{part}`` app transaction equals the end of
    ``p``'s last delivered read of (q, part); for a (q, part) that ``p`` never read it is 0, the
    partition's start offset, or the end of a family lane's reads of it (a handed-over
    position). Anything else is a position
    applied to a partition it was not read from, or moved ([position]).

A replay step (``Snapshot.replay``: ``processing/replay.py``) re-reads the ranges of one error row
on purpose and moves no position: its snapshot takes no part in R1-R4 (:func:`continuity`), and
:mod:`.isolated` proves it replays exactly one error row's ranges, once.

What the lake cannot show: two lanes that each read a partition from offset 0 where no binding is
every-partition look exactly like a side input read by both; the deployments registry refuses
such a change before any step. Positions stored under a binding name (lakes before positions were
keyed by queue and partition; recovery migrates them) are not checked by R4.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from cues_platform.audit.report import GAP, OVERLAP, POSITION, Violation
from cues_platform.processing.backing import Range, Record
from cues_platform.processing.lanes import family_of
from cues_platform.queues.layout import LANE_POSITION, PROCESSOR_EPOCH, PROCESSOR_STEP

Key = tuple[str, str]  # (queue, partition)


def own_partition(processor_id: str) -> str:
    """The partition a lane is the lane of (``p``: ``"0"``, ``p.x``: ``"x"``)."""
    family, dot, part = processor_id.partition(".")
    return part if dot else "0"


@dataclass
class Chain:
    """One processor's delivered reads of one (queue, partition), in step order."""

    processor: str
    first_start: int
    first_step: int
    end: int  # the end of its last read
    last_step: int


def _reads(rec: Record) -> list[tuple[str, Range]]:
    """A step's reads, one per (queue, partition) (identical ranges of two bindings once)."""
    seen: dict[Key, tuple[str, Range]] = {}
    out = []
    for binding, r in sorted(rec.snapshot.inputs.items()):
        key = (r.queue, r.partition)
        if key in seen and seen[key][1] == r:
            continue
        seen[key] = (binding, r)
        out.append((binding, r))
    return out


def lane_chains(pid: str, delivered: list[Record]) -> tuple[dict[Key, Chain], list[Violation]]:
    """R1 for one processor: its chain per (queue, partition) and the gaps/overlaps within it."""
    chains: dict[Key, Chain] = {}
    bad: list[Violation] = []
    for rec in sorted(delivered, key=lambda r: r.step):
        for binding, r in _reads(rec):
            if r.size < 0:
                continue  # coverage reports the inverted range
            key = (r.queue, r.partition)
            chain = chains.get(key)
            if chain is None:
                chains[key] = Chain(pid, r.start, rec.step, r.end, rec.step)
                continue
            if r.start > chain.end:
                bad.append(Violation(
                    GAP,
                    f"offsets [{chain.end}, {r.start}) of {r.queue}/{r.partition} were skipped by "
                    f"{pid!r} (binding {binding!r}): step {chain.last_step} ends at {chain.end}, "
                    f"its next read of the partition (step {rec.step}) starts at {r.start}",
                    processor=pid, queue=r.queue, partition=r.partition,
                    offsets=(chain.end, r.start), step=rec.step, hash=rec.hash,
                ))  # fmt: skip
            elif r.start < chain.end:
                bad.append(Violation(
                    OVERLAP,
                    f"offsets [{r.start}, {min(chain.end, r.end)}) of {r.queue}/{r.partition} "
                    f"were delivered twice by {pid!r} (binding {binding!r}): step "
                    f"{chain.last_step} ends at {chain.end}, step {rec.step} starts at {r.start}",
                    processor=pid, queue=r.queue, partition=r.partition,
                    offsets=(r.start, max(r.start, min(chain.end, r.end))), step=rec.step,
                    hash=rec.hash,
                ))  # fmt: skip
            chain.end, chain.last_step = r.end, rec.step
    return chains, bad


def exclusive_owners(delivered: Mapping[str, list[Record]]) -> dict[Key, str]:
    """R3: (queue, partition) -> the lane that owns it, for every-partition bindings (read by two
    or more lanes of one family, each at its own partition)."""
    own_reads: dict[tuple[str, str, str], dict[str, str]] = defaultdict(dict)  # (family, binding, q) -> lane -> part
    for pid, recs in delivered.items():
        mine = own_partition(pid)
        for rec in recs:
            for binding, r in rec.snapshot.inputs.items():
                if r.partition == mine:
                    own_reads[(family_of(pid), binding, r.queue)][pid] = r.partition
    owners: dict[Key, str] = {}
    for (_, _, queue), lanes in own_reads.items():
        if len(lanes) >= 2:
            for lane, part in lanes.items():
                owners[(queue, part)] = lane
    return owners


Stored = Mapping[tuple[str, str, str], tuple[int, int | None]]


def continuity(delivered: Mapping[str, list[Record]]) -> dict[str, list[Record]]:
    """The delivered steps that read new ranges: all but replay steps (module docstring)."""
    return {pid: [r for r in recs if r.snapshot.replay is None] for pid, recs in delivered.items()}


def position_checks(delivered: Mapping[str, list[Record]], stored: Stored,
                    starts: Mapping[Key, int] | None = None,
                    truncated: frozenset[str] = frozenset()) -> list[Violation]:
    """R1-R4 over every processor's delivered steps. ``stored``: (processor, queue, partition) ->
    (the ``pos:`` app transaction in its home queue, the home's ``proc:`` step there).
    ``starts``: (queue, partition) -> start offset (retention; absent: 0). ``truncated``:
    processors whose first steps were retained away from their backing queue (their first reads
    are not their first: R2 is not checked for them)."""
    starts = starts or {}
    delivered = continuity(delivered)
    bad: list[Violation] = []
    chains: dict[str, dict[Key, Chain]] = {}
    for pid, recs in sorted(delivered.items()):
        chains[pid], within = lane_chains(pid, recs)
        bad += within
    families: dict[str, list[str]] = defaultdict(list)
    for pid in sorted(chains):
        families[family_of(pid)].append(pid)
    owners = exclusive_owners(delivered)
    for family, lanes in sorted(families.items()):
        keys = sorted({k for pid in lanes for k in chains[pid]})
        for key in keys:
            readers = [chains[pid][key] for pid in lanes if key in chains[pid]]
            start = starts.get(key, 0)
            bad += _handoffs(family, key, [c for c in readers if c.processor not in truncated],
                             readers, start)
            owner = owners.get(key)
            if owner is not None and owner in lanes:
                bad += _exclusive(key, owner, readers, start)
        for pid in lanes:
            bad += _stored(pid, lanes, chains, delivered.get(pid, []), stored, starts)
    return bad


def _handoffs(family: str, key: Key, checked: list[Chain], readers: list[Chain],
              start: int = 0) -> list[Violation]:
    """R2: a first read that does not start at 0 continues a family lane that ended there, or
    starts at or below the start offset where no family lane read before."""
    queue, part = key
    bad = []
    for c in checked:
        if c.first_start == 0:
            continue
        others = [o for o in readers if o is not c]
        if any(o.end == c.first_start for o in others):
            continue  # handed over from that lane
        past = [o for o in others if o.first_start < c.first_start < o.end]
        if past:
            o = min(past, key=lambda o: o.end)
            stop = min(o.end, c.end) if c.end > c.first_start else o.end
            bad.append(Violation(
                OVERLAP,
                f"{c.processor!r} started reading {queue}/{part} at {c.first_start} (step "
                f"{c.first_step}), but {o.processor!r} of the same family read it up to {o.end}: "
                f"offsets [{c.first_start}, {stop}) are delivered twice (a position carried from "
                "another partition or lane)",
                processor=c.processor, queue=queue, partition=part,
                offsets=(c.first_start, stop), step=c.first_step,
            ))  # fmt: skip
            continue
        before = max((o.end for o in others if o.end < c.first_start), default=0)
        who = [o.processor for o in others if o.end == before and before > 0]
        if not who and c.first_start <= start:
            continue  # deployed after retention: [0, first start) is retained-away, not skipped
        after = f"{who[0]!r} of the same family ended at {before}" if who else "nothing read it before"
        if not who and start > 0:  # offsets below the start are retained-away, not skipped
            before = start
            after = f"nothing read it before (offsets [0, {start}) are retained-away)"
        bad.append(Violation(
            GAP,
            f"{c.processor!r} started reading {queue}/{part} at {c.first_start} (step "
            f"{c.first_step}) where {after}: offsets [{before}, {c.first_start}) are never "
            f"delivered by family {family!r} (a position carried from another partition or lane)",
            processor=c.processor, queue=queue, partition=part,
            offsets=(before, c.first_start), step=c.first_step,
        ))  # fmt: skip
    return bad


def _fresh(c: Chain, readers: list[Chain], start: int) -> bool:
    """``c`` reads from the beginning: offset 0, or the start offset (or below) with no family
    lane ending where it starts (not a hand-over)."""
    return c.first_start == 0 or (
        c.first_start <= start and not any(o.end == c.first_start for o in readers if o is not c))


def _exclusive(key: Key, owner: str, readers: list[Chain], start: int = 0) -> list[Violation]:
    """R3: no other lane reads the owner's partition from the beginning too."""
    queue, part = key
    mine = next((c for c in readers if c.processor == owner), None)
    if mine is None or not _fresh(mine, readers, start):
        return []  # the owner took it over (R2 checked its start)
    bad = []
    for c in readers:
        if c is mine or not _fresh(c, readers, start):
            continue
        first = max(c.first_start, mine.first_start)
        stop = min(c.end, mine.end)
        if stop <= first:
            continue
        bad.append(Violation(
            OVERLAP,
            f"{queue}/{part} is lane {owner!r}'s own partition (its family reads {queue} one "
            f"partition per lane), yet {c.processor!r} read it from {c.first_start} too: offsets "
            f"[{first}, {stop}) are delivered twice",
            processor=c.processor, queue=queue, partition=part, offsets=(first, stop),
            step=c.first_step,
        ))  # fmt: skip
    return bad


def _stored(pid: str, lanes: list[str], chains: Mapping[str, Mapping[Key, Chain]],
            recs: list[Record], stored: Stored,
            starts: Mapping[Key, int] | None = None) -> list[Violation]:
    """R4: the stored positions of ``pid`` agree with what it (or its family) read. A position is
    compared with the steps its home has (``proc:`` <= the home's step): an attempt recorded
    after it is not closed by the home yet (recovery closes it) and moves no position."""
    bad = []
    for (p, queue, part), (value, home_step) in sorted(stored.items()):
        if p != pid:
            continue
        reads = [(rec.step, r) for rec in recs for r in rec.snapshot.inputs.values()
                 if (r.queue, r.partition) == (queue, part)
                 and (home_step is None or rec.step <= home_step)]
        end = max(reads, key=lambda sr: (sr[0], sr[1].end))[1].end if reads else None
        if end is not None:
            if value == end:
                continue
            last = max(step for step, _ in reads)
            why = f"its last delivered read of it (step {last}) ends at {end}"
        else:
            ends = {chains[o][(queue, part)].end for o in lanes
                    if o != pid and (queue, part) in chains[o]}
            if value == 0 or value in ends or value == (starts or {}).get((queue, part), 0):
                continue
            why = ("it never read that partition"
                   + (f" and its family's reads end at {sorted(ends)}" if ends else ""))
        bad.append(Violation(
            POSITION,
            f"{pid!r}'s stored position on {queue}/{part} ({LANE_POSITION.id(pid, queue, part)}) is "
            f"{value}, but {why}: its next step would skip or repeat offsets (a position moved or "
            "carried from another partition)",
            processor=pid, queue=queue, partition=part,
            offsets=(min(value, end), max(value, end)) if end is not None else None,
        ))  # fmt: skip
    return bad


def stored_positions(delivered: Mapping[str, list[Record]], queues: Mapping[str, object],
                     processors: Mapping[str, object]) -> dict[tuple[str, str, str], tuple[int, int | None]]:
    """(processor, queue, partition) -> (its ``pos:`` app transaction, that queue's ``proc:``
    step), for every (queue, partition) its family read, looked up in every queue that holds the
    processor's ``epoch:`` or ``proc:`` app transaction (its home). ``queues``: name -> Queue."""
    keys_of_family: dict[str, set[Key]] = defaultdict(set)
    for pid, recs in continuity(delivered).items():
        for rec in recs:
            for r in rec.snapshot.inputs.values():
                keys_of_family[family_of(pid)].add((r.queue, r.partition))
    out: dict[tuple[str, str, str], tuple[int, int | None]] = {}
    tables = {name: q.refresh() for name, q in sorted(queues.items())}  # type: ignore[attr-defined]
    for pid in sorted(processors):
        homes = [dt for dt in tables.values()
                 if dt.transaction_version(PROCESSOR_EPOCH.id(pid)) is not None
                 or dt.transaction_version(PROCESSOR_STEP.id(pid)) is not None]
        for queue, part in sorted(keys_of_family.get(family_of(pid), ())):
            for dt in homes:
                value = dt.transaction_version(LANE_POSITION.id(pid, queue, part))
                if value is not None:
                    step = dt.transaction_version(PROCESSOR_STEP.id(pid))
                    out[(pid, queue, part)] = (int(value), None if step is None else int(step))
    return out
