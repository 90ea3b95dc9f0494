"""The permissions of the operator actions (no table).

Django permissions belong to a model; these belong to none of the data
models, because each action spans them (a purge cancels tasks of a queue, a
replay moves a task out of the DLQ).  `Operation` is a model without a table
that only carries them: `dashboard.pause_queue`, and so on.  Which group
holds which permission: `dashboard.roles`.
"""

from __future__ import annotations

from django.db import models


class Operation(models.Model):
    class Meta:
        managed = False  # no table: permissions only
        default_permissions = ()
        verbose_name = "operator action"
        permissions = [
            ("pause_queue", "Can pause and resume queues"),
            ("purge_queue", "Can purge queues"),
            ("cancel_task", "Can cancel tasks"),
            ("replay_task", "Can replay dead tasks"),
            ("discard_task", "Can discard dead tasks"),
            ("pause_schedule", "Can pause and resume schedules"),
        ]

    def __str__(self) -> str:
        return "operator action"
