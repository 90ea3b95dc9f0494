"""Create the `emails` queue and enqueue a few tasks, then watch them finish.

    .venv/bin/python examples/producer.py            # 5 tasks, waits until they are done
    .venv/bin/python examples/producer.py -n 100 --no-wait

Run `examples/worker.py` in another shell to process them. Uses the admin key of
`make run` (`.taskforge/admin_api_key`) or `TASKFORGE_API_KEY`; the server is
`TASKFORGE_URL` (default http://localhost:8080). Creating a queue needs the admin
role; enqueueing needs producer (or admin).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from _connection import api_key, url

from taskforge_client import Conflict, TaskForge, TaskSpec

QUEUE = "emails"
TERMINAL = {"done", "dead", "cancelled"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--count", type=int, default=5, help="tasks to enqueue (default 5)")
    parser.add_argument("--queue", default=QUEUE)
    parser.add_argument("--no-wait", action="store_true", help="do not wait for the tasks")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait at most")
    args = parser.parse_args()

    with TaskForge(url(), api_key()) as tf:
        try:
            tf.create_queue(args.queue, max_retries=3)
            print(f"created queue {args.queue}")
        except Conflict:
            print(f"queue {args.queue} exists")

        # One task on its own, with an idempotency key: enqueueing it again (a retry
        # after a timeout, say) returns the same task instead of adding a second one.
        run = uuid.uuid4().hex[:8]
        welcome = tf.enqueue(
            args.queue,
            {"to": "new-user@example.com", "template": "welcome"},
            priority=1,
            idempotency_key=f"welcome-{run}",
        )
        again = tf.enqueue(
            args.queue,
            {"to": "new-user@example.com", "template": "welcome"},
            priority=1,
            idempotency_key=f"welcome-{run}",
        )
        assert again.id == welcome.id
        # The rest in one batch call (all or nothing, up to 1000 per call).
        specs = [
            TaskSpec({"to": f"user{i}@example.com", "template": "digest"})
            for i in range(max(0, args.count - 1))
        ]
        tasks = [welcome, *(tf.enqueue_many(args.queue, specs) if specs else [])]
        for task in tasks:
            print(f"enqueued {task.id} {task.payload}")
        if args.no_wait:
            return 0

        print(f"waiting for a worker (start examples/worker.py) to process {len(tasks)} tasks")
        deadline = time.monotonic() + args.timeout
        remaining = {task.id for task in tasks}
        while remaining and time.monotonic() < deadline:
            for task_id in sorted(remaining):
                task = tf.get_task(args.queue, task_id)
                if task.status in TERMINAL:
                    remaining.discard(task_id)
                    print(f"{task.id} {task.status} result={task.result}")
            time.sleep(0.5)
        if remaining:
            print(f"{len(remaining)} tasks not finished after {args.timeout:g} s", file=sys.stderr)
            return 1
        stats = tf.stats(args.queue)
        print(f"all done; queue {args.queue}: {stats.raw}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
