"""task_executing_since_idx replaces task_executing_hb_idx: heartbeats become HOT updates.

A heartbeat writes `heartbeat_at` alone.  While an index held that column,
every heartbeat was a non-HOT update: a new entry in each of the table's
indexes that cover an executing task (six), for every task of every heartbeat
call.  The watchdog now finds expired leases among the tasks handed out longer
ago than the lease timeout (`claimed_at`, written once per attempt, at the
hand-out), checking `heartbeat_at` in the row.  Built CONCURRENTLY before the
old index is dropped (CONCURRENTLY as well): enqueues, claims, heartbeats and
acks go on meanwhile, and a watchdog of the previous version still finds an
index until the new one is ready.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks", "0010_executing_by_worker"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                condition=models.Q(("claimed_at__isnull", False), ("status", "executing")),
                fields=["claimed_at"],
                name="task_executing_since_idx",
            ),
        ),
        RemoveIndexConcurrently(
            model_name="task",
            name="task_executing_hb_idx",
        ),
    ]
