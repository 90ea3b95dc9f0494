from __future__ import annotations

from taskforge.errors import NotFound, TaskForgeError


class QueueExists(TaskForgeError):
    """A queue with this name exists already."""

    code = "queue_exists"
    status_code = 409


class QueueNotEmpty(TaskForgeError):
    """The queue still has pending, claimed, executing, retry or dead tasks."""

    code = "queue_not_empty"
    status_code = 409


class UnknownQueue(NotFound):
    """No such queue."""
