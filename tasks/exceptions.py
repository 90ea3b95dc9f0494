from __future__ import annotations

from taskforge.errors import TaskForgeError


class InvalidTransition(TaskForgeError):
    """The task is not in a status that allows this."""

    code = "invalid_state"
    status_code = 409


class LeaseLost(TaskForgeError):
    """This worker does not hold the task's lease (it expired, or another worker holds it)."""

    code = "lease_lost"
    status_code = 409
