"""The Django admin of every TaskForge model, part of the operator dashboard.

The admin lives here, above the apps, so it may act through any app's
services; writes go through them (`queues.services`, `tasks.services`,
`dlq.services`), never straight to a status.
"""

from __future__ import annotations

from dashboard.admin import audit, dlq, keys, queues, schedules, tasks, workers

__all__ = ["audit", "dlq", "keys", "queues", "schedules", "tasks", "workers"]
