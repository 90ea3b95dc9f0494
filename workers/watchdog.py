"""The watchdog: expired leases, lost buffer entries, and forgotten workers.

- Every TASKFORGE_WATCHDOG_INTERVAL_SECONDS, `executing` tasks whose lease
  expired (no heartbeat for TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS) become a
  failed attempt, retried or dead by the same rule as a nack.
- Every third of TASKFORGE_BUFFER_RECONCILE_SECONDS, capped queues' running
  counts are set right from Postgres (tasks.concurrency), then `claimed`
  tasks missing from Redis are put back, so a lost one is dispatchable again
  within that time.
- Workers not seen for a day are forgotten (GET /workers shows the last hour).
- Finished tasks past their retention are deleted (tasks.retention), with the
  lease check.
- Each tick, apps above tasks tidy their records (`tasks.signals.upkeep`):
  the DLQ folds its depth rows and now and then checks them (dlq.depth).
- The task tables are vacuumed when their dead rows pile up (tasks.vacuum),
  on a thread of their own.
"""

from __future__ import annotations

import time
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from taskforge.conf import conf
from taskforge.lib.loop import Loop
from tasks import concurrency, retention, signals, transitions
from tasks.models import Task
from tasks.reconcile import rebuffer_missing
from tasks.vacuum import Vacuumer
from workers.models import Worker

BATCH = 200
FORGET_WORKERS_AFTER = timedelta(days=1)
# Retention batches per round (tasks.retention.BATCH tasks each).
RETENTION_BATCHES = 20


class WatchdogLoop(Loop):
    name = "watchdog"

    def __init__(self) -> None:
        super().__init__()
        self._next_lease_check = 0.0
        self._retention_due = False
        self.vacuumer = Vacuumer()

    @property
    def interval(self) -> float:
        return min(conf.WATCHDOG_INTERVAL_SECONDS, conf.BUFFER_RECONCILE_SECONDS / 3)

    def tick(self) -> bool:
        busy = False
        if time.monotonic() >= self._next_lease_check:
            busy = self.expire_leases()
            if not busy:
                self._next_lease_check = time.monotonic() + conf.WATCHDOG_INTERVAL_SECONDS
                self.forget_workers()
                self._retention_due = True
        if self._retention_due:
            # A backlog of expired tasks is worked off a round per tick, between the rest.
            self._retention_due = self.delete_expired()
            busy = busy or self._retention_due
        self.reconcile()
        signals.upkeep.send(sender=WatchdogLoop)
        self.vacuumer.poll()
        return busy

    def delete_expired(self) -> bool:
        """One round of retention (tasks.retention); True when there may be more."""
        deleted = retention.delete_expired(max_batches=RETENTION_BATCHES)
        return deleted >= RETENTION_BATCHES * retention.BATCH

    def expire_leases(self) -> bool:
        """Fail one batch of expired leases; True if the batch was full."""
        now = timezone.now()
        with transaction.atomic():
            # Uses task_executing_since_idx, oldest hand-out first; SKIP LOCKED
            # so watchdogs share the work and never wait on a worker's ack
            # holding the row.
            tasks = list(
                Task.objects.lease_expired(now)
                .select_for_update(skip_locked=True, no_key=True, of=("self",))
                .select_related("queue")
                .order_by("claimed_at")[:BATCH]
            )
            holders = {task.claimed_by for task in tasks if task.claimed_by}
            for task in tasks:
                transitions.expire_lease(task, now=now)
            # The dashboard tells a worker that lost tasks (stale) from one that left.
            Worker.objects.filter(worker_id__in=holders).update(lost_tasks_at=now)
        return len(tasks) == BATCH

    def reconcile(self) -> int:
        age = timedelta(seconds=conf.BUFFER_RECONCILE_SECONDS / 3)
        # Slots first: an id a dead claim left holding one is free again
        # before it goes back into the ready set.  A claim between its take
        # and its hand-out holds a slot of a task not yet executing: half the
        # interval is far longer than that takes, and a slot left behind is
        # still free within the interval (this runs every third of it).
        concurrency.reconcile_running(grace=timedelta(seconds=conf.BUFFER_RECONCILE_SECONDS / 2))
        return rebuffer_missing(claimed_before=timezone.now() - age)

    def forget_workers(self) -> None:
        Worker.objects.filter(last_seen_at__lt=timezone.now() - FORGET_WORKERS_AFTER).delete()
