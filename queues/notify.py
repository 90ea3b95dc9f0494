"""Waking the loops: Postgres NOTIFY to the dispatchers (payload: a queue id) and schedulers.

Whatever makes a queue's tasks dispatchable (an enqueue, a retry coming due,
a replay, a resumed queue) sends it; the dispatchers LISTEN.  A NOTIFY is
delivered when its transaction commits, so a dispatcher never looks before
the change is visible.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connection

from queues import sql

DISPATCH_CHANNEL = "taskforge_dispatch"


def wake_dispatchers(queue_ids: Iterable[Any]) -> None:
    """NOTIFY for each queue id (sorted, once each); sent on commit when inside atomic()."""
    with connection.cursor() as cursor:
        for queue_id in sorted({str(queue_id) for queue_id in queue_ids}):
            cursor.execute(sql.NOTIFY, {"channel": DISPATCH_CHANNEL, "payload": queue_id})


# The scheduler sleeps until the next due time it knows of (a delayed task,
# a retry, a schedule's next fire).  Whatever makes a time due that it may not
# know of sends that time, as Unix seconds, on this channel; a scheduler
# woken by an earlier time than it waits for wakes then instead.
SCHEDULER_CHANNEL = "taskforge_scheduler"


def wake_scheduler(at: datetime) -> None:
    """NOTIFY the schedulers that something comes due at `at`; on commit inside atomic()."""
    with connection.cursor() as cursor:
        cursor.execute(
            sql.NOTIFY, {"channel": SCHEDULER_CHANNEL, "payload": f"{at.timestamp():.6f}"}
        )
