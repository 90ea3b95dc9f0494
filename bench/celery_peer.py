"""The Celery 5 peer of `make bench`'s SDK row, measured in the same run (`--only celery`).

The same shape as the SDK row: producer threads sending one task at a time, two worker
processes at concurrency 8, acks_late (a task is acknowledged after it ran, as TaskForge
acks), Redis as the broker (the db of REDIS_URL, on its own queue; the bench deletes the
keys afterwards). The task body counts itself with one Redis INCR so the bench can read
tasks/s; TaskForge's SDK handler counts in shared memory instead, so this costs Celery a
little more per task.

Not part of TaskForge: only `bench/run.py` imports it, and only when Celery is installed
(`pip install 'celery[redis]'`, or `.venv/bin/pip install -e '.[bench]'`).
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

import redis
from celery import Celery

BROKER = os.environ.get("BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/0")
COUNTER = os.environ.get("BENCH_CELERY_COUNTER", "bench-celery:done")


def kombu_url(url: str) -> str:
    """REDIS_URL as Celery's broker URL: kombu names a unix socket `redis+socket://`
    and its db `virtual_host` (`make bench`'s own Redis listens on a socket)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "unix":
        return url
    query = urllib.parse.parse_qs(parts.query)
    db = query.get("db", ["0"])[0]
    return f"redis+socket://{parts.path}?virtual_host={db}"


app = Celery("bench_peer", broker=kombu_url(BROKER))
app.conf.update(
    task_acks_late=True,
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_counter: Any = None


@app.task(name="bench.noop")
def noop(payload: Any) -> None:
    global _counter
    if _counter is None:
        _counter = redis.Redis.from_url(BROKER)
    _counter.incr(COUNTER)
