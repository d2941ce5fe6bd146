"""A local S3 for tests: moto's server on 127.0.0.1, a random port, in its own process.

Run as ``python tests/queues/moto_s3.py [--conditional atomic|ignored]``; it prints
``PORT <n>`` on its first line once it listens and serves until SIGTERM.

Why not ``moto_server`` or ``ThreadedMotoServer`` as they are:

* In-process (``ThreadedMotoServer``) deadlocks with delta-rs: ``DeltaStorageHandler``'s listing
  holds the GIL while it waits for the HTTP answer, and the in-process server needs the GIL to
  give it (measured: a listing timed out after 180 s of retries). A separate process has its own.
* moto checks ``If-None-Match: *`` (S3's conditional write, which delta-rs 1.x uses to commit a
  log entry only if it does not exist) and then stores the object in a later statement, in a
  threaded server, without a lock: two PUTs of the same key racing in the same instant could
  both pass the check (we never saw it in 30 rounds of 8 racing PUTs, but nothing excludes it).
  Real S3 decides a conditional write atomically. ``atomic`` (the default) serializes moto's
  request handling with one lock, which makes its check-then-store atomic like S3's; requests of
  different clients still interleave between requests, which is what a writer race needs.
* ``ignored`` drops the ``If-None-Match`` header before moto sees it: an S3-compatible store
  without conditional writes (a commit that should fail overwrites instead), for the test that
  shows what that does and that the platform's probe refuses such a store.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from werkzeug.serving import make_server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conditional", choices=["atomic", "ignored"], default="atomic")
    args = parser.parse_args()

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )

    moto_app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if args.conditional == "ignored":
            environ.pop("HTTP_IF_NONE_MATCH", None)
        with lock:
            return list(moto_app(environ, start_response))

    class Quiet(MotoRequestHandler):
        def log_request(self, *_args: Any, **_kwargs: Any) -> None:
            pass

    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=Quiet)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"PORT {server.server_port}", flush=True)
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
