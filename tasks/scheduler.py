"""The scheduler: makes tasks whose `scheduled_at` has come dispatchable.

Every TASKFORGE_SCHEDULER_TICK_SECONDS it
- promotes due `retry` tasks to `pending` (through `transitions.promote`,
  which notifies the dispatchers), in SKIP LOCKED batches;
- notifies the dispatchers of queues whose delayed `pending` tasks came due
  since its last tick, so they are buffered within one tick of their time.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from queues.notify import wake_dispatchers
from taskforge.conf import conf
from taskforge.lib.loop import Loop
from tasks import transitions
from tasks.models import Task, TaskStatus

S = TaskStatus
BATCH = 500


class SchedulerLoop(Loop):
    name = "scheduler"

    def __init__(self) -> None:
        super().__init__()
        self._checked_until: datetime | None = None

    @property
    def interval(self) -> float:
        return conf.SCHEDULER_TICK_SECONDS

    def tick(self) -> bool:
        busy = self.promote_due_retries()
        self.announce_due_delayed()
        return busy

    def promote_due_retries(self) -> bool:
        """retry -> pending for one batch of due tasks; True if the batch was full."""
        now = timezone.now()
        with transaction.atomic():
            # Uses task_retry_due_idx.
            tasks = list(
                Task.objects.select_for_update(skip_locked=True, no_key=True, of=("self",))
                .select_related("queue")
                .filter(status=S.RETRY, scheduled_at__lte=now)
                .order_by("scheduled_at")[:BATCH]
            )
            transitions.promote(tasks, now=now)
        return len(tasks) == BATCH

    def announce_due_delayed(self) -> None:
        """NOTIFY for queues whose delayed pending tasks came due since the last check."""
        now = timezone.now()
        since = self._checked_until or now - timedelta(seconds=max(self.interval, 1.0) * 2)
        # Uses task_pending_sched_idx.
        queue_ids = (
            Task.objects.filter(status=S.PENDING, scheduled_at__gt=since, scheduled_at__lte=now)
            .values_list("queue_id", flat=True)
            .distinct()
        )
        wake_dispatchers(queue_ids)
        self._checked_until = now
