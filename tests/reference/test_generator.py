"""Traffic posted twice to one lake (``participant_traffic`` materialized again in the UI): the
second batch books against the directory the first published, instead of failing on the
directory producer's sequence 0 with other content."""

from __future__ import annotations

from cues_platform.processing.runner import create_queues
from cues_platform.reference.generator import TrafficSpec, generate
from cues_platform.reference.pipeline import payments_graph


def test_a_second_traffic_batch_reuses_the_published_directory(lake) -> None:
    create_queues(payments_graph(), lake)
    first = generate(lake, TrafficSpec(messages=40, seed=5))
    directory = lake.queue("accounts").read_arrow(partition="0")
    second = generate(lake, TrafficSpec(messages=60, seed=41))  # another seed: other balances if drawn again
    assert lake.queue("accounts").read_arrow(partition="0").equals(directory)  # published once
    assert second.directory_rows == first.directory_rows == directory.num_rows
    assert lake.queue("postings").count() == first.postings + second.postings == 100
