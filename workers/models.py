"""Workers as TaskForge sees them: a name and when it last spoke."""

from __future__ import annotations

from django.db import models


class Worker(models.Model):
    worker_id = models.CharField(max_length=200, primary_key=True)
    last_seen_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return self.worker_id
