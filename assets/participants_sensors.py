"""One sensor per participant: run its pass when its input queue has new data.

Input queue: POSTINGS (subject = the consumer) for a consumer, RESULTS (subject = the producer)
for a producer. The cursor is ``{"<queue>": <Delta version>, "end": <next offset of the
subject>}``. A new version whose commit did not touch the subject (another participant's data)
only moves the cursor; a new end offset requests one run with the deterministic run key
``participant__<id>@<queue>.v<version>`` (``sensors.new_data_run_key``): a tick repeated before
its cursor was saved asks again with the same key, which Dagster launches once. The sensor reads
the lake's Delta log only (resource ``participants_lake``), never a database.

A producer also has work when postings are recorded in its database, which no queue shows: the
schedule ``participants__schedule`` (or a materialization by hand) publishes those; it asks the
databases and skips when no participant has work (``participants.py``).
"""

from __future__ import annotations

import json
from typing import Any

from dagster import (
    AssetKey,
    AssetSelection,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from cues_platform.dagster.sensors import TRIGGER_TAG, new_data_run_key
from cues_platform.participants.model import POSTINGS, RESULTS, Role


def input_queue(role: Role) -> str:
    return POSTINGS if role is Role.CONSUMER else RESULTS


def sensor_name(participant: str) -> str:
    return f"participant__{participant.replace('-', '_')}__new_data"


def input_state(lake: Any, queue: str, subject: str) -> dict[str, int]:
    """``{queue: version, "end": next offset of subject}`` (-1 / 0 while missing)."""
    if not lake.has_queue(queue):
        return {queue: -1, "end": 0}
    q = lake.queue(queue)
    end = q.next_offset(subject) if subject in q.partitions else 0
    return {queue: q.version(), "end": end}


def build_participant_sensor(participant: str, role: Role, key: AssetKey, *, lake_key: str,
                             minimum_interval_seconds: int = 30,
                             default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
                             job: Any = None) -> Any:
    """``job``: the job its runs carry (``participants__<id>``); None: an anonymous asset job."""
    queue = input_queue(role)

    @sensor(name=sensor_name(participant), target=job if job is not None else AssetSelection.assets(key),
            minimum_interval_seconds=minimum_interval_seconds, default_status=default_status,
            required_resource_keys={lake_key},
            description=f"Runs participant {participant!r} ({role.value}) when {queue} subject "
                        f"{participant!r} has new rows (a new Delta version).")
    def _sensor(context: SensorEvaluationContext):
        lake = getattr(context.resources, lake_key).lake()
        state = input_state(lake, queue, participant)
        cursor = json.dumps(state, sort_keys=True)
        previous = json.loads(context.cursor) if context.cursor else {}
        if previous == state:
            return SkipReason(f"no new commit on {queue} since the last tick")
        if state["end"] <= previous.get("end", 0):
            return SensorResult(skip_reason=SkipReason(
                f"no new rows for subject {participant!r} on {queue}"), cursor=cursor)
        run_key = new_data_run_key(f"participant__{participant}", {queue: state[queue]})
        request = RunRequest(run_key=run_key, asset_selection=[key],
                             tags={TRIGGER_TAG: "new_data", "cues/participant": participant})
        return SensorResult(run_requests=[request], cursor=cursor)

    return _sensor
