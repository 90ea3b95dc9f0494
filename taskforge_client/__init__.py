"""TaskForge Python SDK: a client of the HTTP API, a worker runtime and a CLI.

No Django dependency: only the standard library and urllib3.

    from taskforge_client import TaskForge, Worker, Permanent

    tf = TaskForge("http://localhost:8080", api_key)
    tf.enqueue("emails", {"to": "a@example.com"}, priority=1)
"""

from __future__ import annotations

from taskforge_client.client import RetryPolicy, TaskForge, TaskSpec
from taskforge_client.errors import (
    Conflict,
    ConnectionFailed,
    Forbidden,
    Invalid,
    LeaseLost,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ServerError,
    TaskForgeError,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
)
from taskforge_client.models import (
    BatchResult,
    DeadLetter,
    Depth,
    Heartbeat,
    Queue,
    QueueKey,
    Schedule,
    Stats,
    Task,
    TaskEvent,
)
from taskforge_client.runtime import Permanent, RetryAfter, Worker

__all__ = [
    "BatchResult",
    "Conflict",
    "ConnectionFailed",
    "DeadLetter",
    "Depth",
    "Forbidden",
    "Heartbeat",
    "Invalid",
    "LeaseLost",
    "MethodNotAllowed",
    "NotFound",
    "PayloadTooLarge",
    "Permanent",
    "Queue",
    "QueueKey",
    "RetryAfter",
    "RetryPolicy",
    "Schedule",
    "ServerError",
    "Stats",
    "Task",
    "TaskEvent",
    "TaskForge",
    "TaskForgeError",
    "TaskSpec",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "Worker",
]
