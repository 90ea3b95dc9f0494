from __future__ import annotations

from taskforge.errors import TaskForgeError


class LeaseLost(TaskForgeError):
    """This worker does not hold the task's lease (it expired, or another worker holds it)."""

    code = "lease_lost"
    status_code = 409
