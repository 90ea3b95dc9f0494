"""The JSON log line and the metrics of each committed move of a task's status.

`tasks.transitions` calls these for every move it makes; a statement of many
tasks logs one record carrying every line (`JSON_LINES`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from taskforge import metrics
from taskforge.lib import logging as json_logging
from taskforge.lib.logging import JSON_LINES
from tasks.models import Task

logger = logging.getLogger("taskforge.transitions")


def log_rows(
    tasks: Sequence[Task], from_status: str, *, event: str, now: datetime, worker_id: str | None
) -> None:
    """Log lines for tasks moved by one SQL statement (it wrote their events)."""
    log_on_commit(
        f"task.{event}",
        tasks,
        [from_status] * len(tasks),
        # previous_changed_at: a column the statement returns beside the task's own.
        [now - getattr(task, "previous_changed_at") for task in tasks],  # noqa: B009
        worker_id,
    )


def log_on_commit(
    event: str,
    tasks: Sequence[Task],
    from_statuses: Sequence[str | None],
    durations: Sequence[timedelta | None],
    worker_id: str | None,
) -> None:
    lines = [
        line(task.pk, task.queue.name, worker_id, from_status, task.status, task.attempts, duration)
        for task, from_status, duration in zip(tasks, from_statuses, durations, strict=True)
    ]
    transaction.on_commit(lambda: log(event, lines))


def line(
    task_id: Any,
    queue: str,
    worker_id: str | None,
    from_status: str | None,
    to_status: str,
    attempt: int,
    duration: timedelta | None,
) -> dict[str, Any]:
    """The fields of a transition's JSON log line (API.md, Operations)."""
    return {
        "task_id": str(task_id),
        "queue": queue,
        "worker_id": worker_id,
        "from_status": from_status,
        "to_status": to_status,
        "attempt": attempt,
        "duration_ms": None if duration is None else round(duration.total_seconds() * 1000, 3),
    }


def log(event: str, lines: list[dict[str, Any]]) -> None:
    """The JSON log lines of one committed statement, and its metrics.

    A statement of several tasks (a batch enqueue, a claim of 100, an ack
    batch, a dispatcher pass) logs one record that carries every line
    (`JSON_LINES`): taskforge.lib.logging.JsonFormatter writes it as one JSON
    line per transition, as it writes the record of a single task.  A record
    per task cost more than the statement itself for a batch (py-spy).
    """
    if len(lines) == 1:
        json_logging.info(logger, event, lines[0])
    elif lines:
        json_logging.info(logger, event, {JSON_LINES: lines})
    metrics.on_transitions(event, lines)
