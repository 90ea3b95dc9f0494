"""Call-time access to TaskForge's tunables: `conf.RETRY_BASE_MS`.

Each `TASKFORGE_*` setting is declared once in `settings.py`, with its
environment variable, type and default.  Code reads it through `conf` when it
needs it, never at import, so tests can change it with pytest-django's
`settings` fixture.  The annotations below give type checkers the same names
and types; `taskforge/tests/test_conf.py` keeps them in step with settings.py.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings


class _Conf:
    """`conf.NAME` is `settings.TASKFORGE_NAME`, read at each access."""

    MAX_REQUEST_BYTES: int
    MAX_PAYLOAD_BYTES: int
    RETRY_BASE_MS: int
    RETRY_MAX_DELAY_MS: int
    SCHEDULER_TICK_SECONDS: float
    DISPATCHER_TICK_SECONDS: float
    BUFFER_SIZE: int
    HEARTBEAT_TIMEOUT_SECONDS: float
    WATCHDOG_INTERVAL_SECONDS: float
    BUFFER_RECONCILE_SECONDS: float
    MAX_TICK_FAILURES: int
    RETENTION_SECONDS: int
    DLQ_RETENTION_SECONDS: int
    VACUUM_DEAD_ROWS: int
    METRICS_TOKEN: str
    PUSH_SIGNING_SECRET: str
    PUSH_MAX_IN_FLIGHT: int

    def __getattr__(self, name: str) -> Any:
        # Only reached for names without a value: the annotated ones, or typos.
        if name not in _Conf.__annotations__:
            raise AttributeError(name)
        return getattr(settings, f"TASKFORGE_{name}")


conf = _Conf()
