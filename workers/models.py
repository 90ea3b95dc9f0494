"""Workers as TaskForge sees them: a name and when it last spoke.

The rules every view of workers shares live here: which workers are listed
(seen in the last hour, API.md GET /workers), which are stale (not seen
within the heartbeat timeout) and which tasks each holds now.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import models

from tasks.models import Task, TaskStatus, lease_timeout

SEEN_WITHIN = timedelta(hours=1)


def stale_before(now: datetime) -> datetime:
    """A worker last seen before this is stale."""
    return now - lease_timeout()


def current_tasks(worker_ids: Iterable[str]) -> dict[str, list[str]]:
    """Ids of the tasks each worker executes now (uses task_claimed_by_idx)."""
    held: dict[str, list[str]] = defaultdict(list)
    for task_id, worker_id in Task.objects.filter(
        status=TaskStatus.EXECUTING, claimed_by__in=list(worker_ids)
    ).values_list("id", "claimed_by"):
        if worker_id is not None:  # always, for an executing task
            held[worker_id].append(str(task_id))
    return held


class WorkerQuerySet(models.QuerySet["Worker"]):
    def recent(self, now: datetime) -> WorkerQuerySet:
        """Workers seen in the last hour (uses the last_seen_at index)."""
        return self.filter(last_seen_at__gte=now - SEEN_WITHIN)


class Worker(models.Model):
    worker_id = models.CharField(max_length=200, primary_key=True)
    last_seen_at = models.DateTimeField(db_index=True)

    objects = WorkerQuerySet.as_manager()

    def __str__(self) -> str:
        return self.worker_id

    def is_stale(self, now: datetime) -> bool:
        return self.last_seen_at < stale_before(now)
