"""Process entry point of one participant instance (what ``cues participant run`` spawns).

``python -m cues_platform.participants.instance --id ID --role producer|consumer --lake PATH
(--dsn DSN | --data-dir DIR) [--instance NAME] [--slots X] [--idle-exit S]``

Settings come from ``CUES_PARTICIPANT_*`` environment variables (see ``model.Settings``).
SIGTERM/SIGINT stop it gracefully; SIGKILL is recovered by the leases and the protocol.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys

from cues_platform.participants.consumer import ConsumerInstance
from cues_platform.participants.db import participant_dsn
from cues_platform.participants.model import Role, Settings
from cues_platform.participants.producer import ProducerInstance
from cues_platform.queues import Lake
from cues_platform.settings import current
from cues_platform.signals import StopSignals


def build(args: argparse.Namespace):  # noqa: ANN201
    lake = Lake(root=args.lake)
    dsn = participant_dsn(args.id, dsn=args.dsn or current().postgres_dsn or None,
                          data_dir=args.data_dir)
    instance = args.instance or f"{socket.gethostname()}:{os.getpid()}"
    settings = Settings.from_env()
    if Role(args.role) is Role.PRODUCER:
        return ProducerInstance(participant=args.id, lake=lake, dsn=dsn, instance_id=instance,
                                slots=args.slots, settings=settings)

    return ConsumerInstance(participant=args.id, lake=lake, dsn=dsn, instance_id=instance,
                            settings=settings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cues-participant-instance")
    parser.add_argument("--id", required=True)
    parser.add_argument("--role", required=True, choices=[r.value for r in Role])
    parser.add_argument("--lake", required=True)
    parser.add_argument("--dsn")
    parser.add_argument("--data-dir")
    parser.add_argument("--instance")
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--idle-exit", type=float)
    args = parser.parse_args(argv)
    logging.basicConfig(level=current().log_level,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    inst = build(args)
    with StopSignals(lambda _signum: inst.stop_event.set()):
        stats = inst.run(idle_exit=args.idle_exit)
    print(json.dumps({"instance": inst.instance, **stats}), flush=True)
    return 0


if __name__ == "__main__":
    from cues_platform.participants.supervise import one_line_errors  # ops: one-line errors

    sys.exit(one_line_errors(main))
