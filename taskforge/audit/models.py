"""Audit entries: one row per operator action, never updated, never pruned.

An entry names its queue and target as text, not as foreign keys: it outlives
the queue, task or key it is about (a discard or a queue delete removes those
for good), and retention, which deletes finished tasks, never reaches it.
"""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone


class Action(models.TextChoices):
    """The operator actions API.md's audit log records."""

    QUEUE_CREATE = "queue.create", "queue.create"
    QUEUE_UPDATE = "queue.update", "queue.update"
    QUEUE_DELETE = "queue.delete", "queue.delete"
    QUEUE_PAUSE = "queue.pause", "queue.pause"
    QUEUE_RESUME = "queue.resume", "queue.resume"
    QUEUE_PURGE = "queue.purge", "queue.purge"
    TASK_CANCEL = "task.cancel", "task.cancel"
    TASK_RUN = "task.run", "task.run"
    DLQ_REPLAY = "dlq.replay", "dlq.replay"
    DLQ_DISCARD = "dlq.discard", "dlq.discard"
    SCHEDULE_CREATE = "schedule.create", "schedule.create"
    SCHEDULE_UPDATE = "schedule.update", "schedule.update"
    SCHEDULE_DELETE = "schedule.delete", "schedule.delete"
    APIKEY_CREATE = "apikey.create", "apikey.create"
    APIKEY_REVOKE = "apikey.revoke", "apikey.revoke"


class ActorKind(models.TextChoices):
    API_KEY = "api_key", "API key"
    USER = "user", "User"
    CLI = "cli", "Command line"


class AuditEntry(models.Model):
    at = models.DateTimeField(default=timezone.now)
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    # A key's or a user's name: a key of that name may be revoked and the user
    # deleted since, and the entry still says who it was.
    actor_name = models.CharField(max_length=200)
    action = models.CharField(max_length=32, choices=Action.choices)
    queue = models.CharField(max_length=100, null=True, blank=True)
    target = models.CharField(max_length=200, null=True, blank=True)
    details = models.JSONField(default=dict, encoder=DjangoJSONEncoder)

    class Meta:
        verbose_name = "audit entry"
        verbose_name_plural = "audit log"
        indexes = [
            # GET /audit and the dashboard's audit page: newest first, cut on
            # (at, id) by taskforge.lib.keyset; the other filters are few rows.
            models.Index(fields=["-at", "-id"], name="audit_at_idx"),
            # ?queue=: one queue's history.
            models.Index(fields=["queue", "-at", "-id"], name="audit_queue_at_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(action__in=Action.values), name="audit_action"
            ),
            models.CheckConstraint(
                condition=models.Q(actor_kind__in=ActorKind.values), name="audit_actor_kind"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} by {self.actor_kind}:{self.actor_name}"
