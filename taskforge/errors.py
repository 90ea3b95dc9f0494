"""The base of TaskForge's domain errors.

Each error carries the API error `code` and HTTP `status_code` it maps to, and
its docstring is the default message, so the API's exception handler renders
any of them without a table of its own.
"""

from __future__ import annotations


class TaskForgeError(Exception):
    """Something went wrong in TaskForge."""

    code = "internal"
    status_code = 500

    def __init__(self, message: str | None = None) -> None:
        self.message = message or (self.__doc__ or self.code).strip().splitlines()[0]
        super().__init__(self.message)


class NotFound(TaskForgeError):
    """No such object."""

    code = "not_found"
    status_code = 404
