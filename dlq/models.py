"""The dead-letter queue: one entry per task that ran out of attempts."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import F

from queues.models import Queue
from tasks.models import Task


class DeadLetterQuerySet(models.QuerySet["DeadLetterTask"]):
    def dead_now(self) -> DeadLetterQuerySet:
        """Entries whose task is dead now: the DLQ (a replayed task keeps its entry).

        Read from the entry alone, died more often than replayed, not from its
        task's status: a page of the DLQ then walks dlq_queue_died_idx and stops
        when full, where a join with the tasks read every dead task of every
        queue (the planner cannot know that nearly every entry's task is dead).
        """
        return self.filter(deaths__gt=F("replay_count"))

    def died_between(
        self, after: datetime | None = None, before: datetime | None = None
    ) -> DeadLetterQuerySet:
        """Entries that died in the open interval (after, before); None: unbounded."""
        entries = self
        if after is not None:
            entries = entries.filter(died_at__gt=after)
        if before is not None:
            entries = entries.filter(died_at__lt=before)
        return entries


class DeadLetterTask(models.Model):
    """A task's DLQ record; its primary key is the task's id.

    The entry outlives a replay (`replayed_at`, `replay_count`) so an operator
    sees a task's history; the DLQ lists only entries whose task is dead now.
    """

    task = models.OneToOneField(
        Task, on_delete=models.CASCADE, primary_key=True, related_name="dead_letter"
    )
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="+", db_index=False)
    payload = models.JSONField()
    last_error = models.TextField(null=True)
    attempts = models.PositiveIntegerField()
    died_at = models.DateTimeField()
    replayed_at = models.DateTimeField(null=True)
    replay_count = models.PositiveIntegerField(default=0)
    # How many times the task died: one more than its replays while it is dead
    # (`dead_now`).  Both move only in the transaction of the task's move
    # (dlq.receivers).
    deaths = models.PositiveIntegerField(default=1)

    objects = DeadLetterQuerySet.as_manager()

    class Meta:
        indexes = [
            # The DLQ list: newest first, keyset-paginated on (died_at, task_id).
            models.Index(fields=["queue", "-died_at", "-task"], name="dlq_queue_died_idx"),
        ]

    def __str__(self) -> str:
        return str(self.task_id)


class DeadCount(models.Model):
    """A change of a queue's DLQ depth: the depth is the sum of the queue's rows.

    Written in the transaction of each move into or out of `dead` and of each
    delete of dead tasks (`dlq.receivers`, on `tasks.signals`), folded and
    checked by `dlq.depth`.  Insert-only: no counter row for writers to wait on.
    """

    id = models.BigAutoField(primary_key=True)
    # No constraint in the database, like TaskEvent's: the rows are written
    # beside their tasks' own moves; deleting a queue deletes its rows (Django's).
    queue = models.ForeignKey(
        Queue, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False
    )
    dead = models.BigIntegerField()  # +n, or -n

    class Meta:
        # The table it had under `tasks`: processes of the version before keep
        # writing it during a rolling upgrade (dlq/migrations/0004_deadcount.py).
        db_table = "tasks_deadcount"
        indexes = [
            # A depth: the queue's few rows, summed from the index.
            models.Index(fields=["queue"], include=["dead"], name="deadcount_queue_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.queue_id}: {self.dead:+d}"
