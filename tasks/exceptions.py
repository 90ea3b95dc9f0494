from __future__ import annotations

from taskforge.errors import TaskForgeError


class InvalidTransition(TaskForgeError):
    """The task is not in a status that allows this."""

    code = "invalid_state"
    status_code = 409
