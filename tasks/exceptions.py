from __future__ import annotations

from taskforge.errors import NotFound, TaskForgeError


class InvalidTransition(TaskForgeError):
    """The task is not in a status that allows this."""

    code = "invalid_state"
    status_code = 409


class ScheduleExists(TaskForgeError):
    """A schedule with this name exists already in this queue."""

    code = "schedule_exists"
    status_code = 409


class UnknownSchedule(NotFound):
    """No such schedule in this queue."""


class NameTaken(TaskForgeError):
    """Requested entity already exists"""

    code = "name_taken"
    status_code = 409


class NameUsedRecently(NameTaken):
    """The task cannot be created because a task with this name existed too recently."""
