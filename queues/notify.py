"""Waking the dispatchers: Postgres NOTIFY on one channel, whose payload is a queue id.

Whatever makes a queue's tasks dispatchable (an enqueue, a retry coming due,
a replay, a resumed queue) sends it; the dispatchers LISTEN.  A NOTIFY is
delivered when its transaction commits, so a dispatcher never looks before
the change is visible.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connection

DISPATCH_CHANNEL = "taskforge_dispatch"

NOTIFY_DISPATCH = f"SELECT pg_notify('{DISPATCH_CHANNEL}', %(queue_id)s)"


def wake_dispatchers(queue_ids: Iterable[Any]) -> None:
    """NOTIFY for each queue id (sorted, once each); sent on commit when inside atomic()."""
    with connection.cursor() as cursor:
        for queue_id in sorted({str(queue_id) for queue_id in queue_ids}):
            cursor.execute(NOTIFY_DISPATCH, {"queue_id": queue_id})
