"""Workers as TaskForge sees them: a name and when it last spoke.

The rules every view of workers shares live here: which workers are listed
(seen in the last hour, API.md GET /workers), which are stale (not seen
within the heartbeat timeout) and which tasks each holds now.

For people on call, a quiet worker is one of two things (`Worker.state`): one
that holds no task has *left* (it stopped cleanly, as every deploy stops
workers: nothing to do), and one that still holds tasks, or whose leases the
watchdog had to reclaim since it was last seen, is *stale* (it died or hangs:
worth a look).  GET /workers keeps API.md's `stale` (quiet, whatever it holds).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import connection, models
from django.db.models import Exists, F, OuterRef, Q

from taskforge.conf import conf
from tasks.models import Task, TaskStatus, lease_timeout
from workers import sql

SEEN_WITHIN = timedelta(hours=1)


def stale_before(now: datetime) -> datetime:
    """A worker last seen before this is stale."""
    return now - lease_timeout()


def current_tasks(worker_ids: Iterable[str]) -> dict[str, list[str]]:
    """Ids of the tasks each worker executes now (uses task_executing_by_idx)."""
    held: dict[str, list[str]] = defaultdict(list)
    for task_id, worker_id in Task.objects.filter(
        status=TaskStatus.EXECUTING, claimed_by__in=list(worker_ids)
    ).values_list("id", "claimed_by"):
        if worker_id is not None:  # always, for an executing task
            held[worker_id].append(str(task_id))
    return held


def held_tasks(worker_ids: Iterable[str], shown: int) -> dict[str, tuple[int, list[str]]]:
    """For each worker that executes tasks now: how many, and the ids of `shown` of
    them (any `shown`, listed in id order).

    Counted and cut in Postgres, two probes per worker of task_executing_by_idx
    (the count reads the index alone): a page of busy workers needs neither all
    their ids nor a row per task.
    """
    ids = list(worker_ids)
    if not ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(sql.HELD_TASKS, [ids, shown])
        return {worker_id: (n, first) for worker_id, n, first in cursor.fetchall()}


# What a worker is to people on call (`Worker.state`).
ACTIVE = "active"
LEFT = "left"  # quiet, holding no task
STALE = "stale"  # quiet while holding tasks


class WorkerQuerySet(models.QuerySet["Worker"]):
    def recent(self, now: datetime) -> WorkerQuerySet:
        """Workers seen in the last hour (uses the last_seen_at index)."""
        return self.filter(last_seen_at__gte=now - SEEN_WITHIN)

    def remembered(self, now: datetime) -> WorkerQuerySet:
        """Workers seen within TASKFORGE_WORKER_FORGET_SECONDS: those `/metrics` shows
        (API.md, "Security (v1.2)"; uses the last_seen_at index)."""
        return self.filter(last_seen_at__gte=now - timedelta(seconds=conf.WORKER_FORGET_SECONDS))

    def with_holding(self) -> WorkerQuerySet:
        """Annotate `holding`: whether the worker executes a task now (task_executing_by_idx)."""
        return self.annotate(
            holding=Exists(
                Task.objects.filter(status=TaskStatus.EXECUTING, claimed_by=OuterRef("worker_id"))
            )
        )

    def lost_tasks_since_seen(self) -> Q:
        """Workers whose leases the watchdog reclaimed after they were last seen."""
        return Q(lost_tasks_at__isnull=False, lost_tasks_at__gte=F("last_seen_at"))


class Worker(models.Model):
    worker_id = models.CharField(max_length=200, primary_key=True)
    last_seen_at = models.DateTimeField(db_index=True)
    # When the watchdog last reclaimed an expired lease of this worker's: a
    # worker that went quiet and lost tasks died or hangs, it did not leave.
    lost_tasks_at = models.DateTimeField(null=True, blank=True)

    objects = WorkerQuerySet.as_manager()

    def __str__(self) -> str:
        return self.worker_id

    def is_stale(self, now: datetime) -> bool:
        """Not seen within the heartbeat timeout (API.md's `stale`)."""
        return self.last_seen_at < stale_before(now)

    def lost_tasks(self) -> bool:
        """The watchdog reclaimed a lease of this worker's after it was last seen."""
        return self.lost_tasks_at is not None and self.lost_tasks_at >= self.last_seen_at

    def state(self, now: datetime, *, holding: bool) -> str:
        """ACTIVE, LEFT (quiet, holding no task) or STALE (quiet while holding tasks,
        or after losing some to the watchdog)."""
        if not self.is_stale(now):
            return ACTIVE
        return STALE if holding or self.lost_tasks() else LEFT


class SigningKey(models.Model):
    """The RSA key the OIDC ID tokens of push requests are signed with (workers.oidc).

    Made on first need and kept here, so that every push process signs with the
    same key and a restart keeps it; `/.well-known/jwks.json` publishes its
    public half.  One row per key (`kid`); the newest signs.
    """

    id = models.BigAutoField(primary_key=True)
    kid = models.CharField(max_length=64, unique=True)
    private_pem = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.kid
