"""Redis memory per million buffered tasks, measured with the buffer's own push.

    REDIS_URL=redis://127.0.0.1:6379/14 SECRET_KEY=x DATABASE_URL=postgres://... \\
        python bench/buffer_memory.py [--tasks 1000000] [--per-queue 1000]

Pushes `--tasks` task ids (uuid4 text, as the dispatcher pushes them, with
scores from `tasks.buffer.score`) into buffers of `--per-queue` tasks each
(TASKFORGE_BUFFER_SIZE's default: 1000), through `tasks.buffer.Buffer.push`,
and reads `used_memory` from INFO before and after.  REDIS_URL's db must be
empty (it refuses otherwise) and is flushed afterwards: point it at a
scratch db.  DATABASE_URL is only read by Django's settings, never used.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--per-queue", type=int, default=1000, help="tasks per queue's buffer")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskforge.settings")
    import django

    django.setup()
    from tasks.buffer import get_buffer, score

    buffer = get_buffer()
    client = buffer.client
    if client.dbsize():
        print(f"REDIS_URL's db holds {client.dbsize()} keys: use an empty scratch db")
        return 1
    before = int(client.info("memory")["used_memory"])
    start = datetime.now(UTC)
    pushed = 0
    try:
        while pushed < args.tasks:
            queue_id = uuid.uuid4()
            count = min(args.per_queue, args.tasks - pushed)
            items = [
                (str(uuid.uuid4()), score(5, start + timedelta(milliseconds=n)))
                for n in range(count)
            ]
            for chunk in range(0, count, 1000):
                buffer.push(queue_id, items[chunk : chunk + 1000])
            pushed += count
        after = int(client.info("memory")["used_memory"])
        keys = client.dbsize()
        encoding = client.object("encoding", next(iter(client.scan_iter(count=1))))
    finally:
        client.flushdb()
    per_million = (after - before) * 1_000_000 / pushed
    print(
        f"{pushed} tasks in {keys} keys ({args.per_queue} a queue, {encoding!r}): "
        f"{(after - before) / 2**20:.1f} MiB, {per_million / 2**20:.1f} MiB per million tasks, "
        f"{(after - before) / pushed:.0f} bytes a task"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
