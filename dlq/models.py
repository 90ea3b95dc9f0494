"""The dead-letter queue: one entry per task that ran out of attempts."""

from __future__ import annotations

from django.db import models

from queues.models import Queue
from tasks.models import Task


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

    class Meta:
        indexes = [
            # The DLQ list: newest first, keyset-paginated on (died_at, task_id).
            models.Index(fields=["queue", "-died_at", "-task"], name="dlq_queue_died_idx"),
        ]

    def __str__(self) -> str:
        return str(self.task_id)
