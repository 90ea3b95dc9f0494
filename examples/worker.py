"""A worker for the `emails` queue: claims tasks, runs `send_email`, acks the result.

    .venv/bin/python examples/worker.py                 # Ctrl-C (or SIGTERM) stops it
    .venv/bin/python examples/worker.py --concurrency 8

The SDK's `Worker` does the protocol: long-polled claims for its free slots,
heartbeats every 10 s for each running task, an ack with the handler's return
value, a nack with the exception's text (retried with backoff, then the
dead-letter queue; `Permanent` skips the retries). On Ctrl-C/SIGTERM it stops
claiming and lets running handlers finish (nacking them after the grace period).

Delivery is at-least-once: a task whose worker died, or whose ack was lost, runs
again. Make handlers idempotent: here, a real implementation would record
`task.id` with the sent message and skip the send when it is already there.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time

from _connection import api_key, url

from taskforge_client import Permanent, Task, Worker

log = logging.getLogger("example.worker")


def send_email(task: Task) -> dict[str, str]:
    """The handler: its return value is stored as the task's `result`."""
    to = task.payload.get("to")
    if not isinstance(to, str) or "@" not in to:
        # Bad input never gets better: fail at once, no retries, straight to the DLQ.
        raise Permanent(f"not an email address: {to!r}")
    log.info(
        "sending %s to %s (task %s, attempt %d)",
        task.payload.get("template"),
        to,
        task.id,
        task.attempts,
    )
    time.sleep(random.uniform(0.05, 0.3))  # the actual work
    return {"sent_to": to, "message_id": f"msg-{task.id}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", default="emails")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    worker = Worker(
        url(),
        api_key(),
        queues=[args.queue],
        handler=send_email,
        concurrency=args.concurrency,
        grace_seconds=20,
    )
    worker.run()  # until Ctrl-C / SIGTERM, then drains
    log.info("stopped: %d processed, %d failed", worker.processed, worker.failed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
