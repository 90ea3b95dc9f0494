"""Call-time access to TaskForge's tunables: `conf.RETRY_BASE_MS`.

Each `TASKFORGE_*` setting is declared once in `settings.py`, with its
environment variable, type and default.  Code reads it through `conf` when it
needs it, never at import, so tests can change it with pytest-django's
`settings` fixture (or `override_settings`).  The annotations below give type
checkers the same names and types; `taskforge/tests/test_conf.py` keeps them in
step with settings.py.

A value read is kept on `conf` until Django's `setting_changed` signal says
that setting changed (what the fixture and `override_settings` send): a read
through Django's lazy settings cost ~4.6 us, and the hot paths read a few per
request and one or two per task of a batch.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed


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
    WORKER_FORGET_SECONDS: float
    PUSH_SIGNING_SECRET: str
    PUSH_MAX_IN_FLIGHT: int
    PUSH_BLOCKED_NETWORKS: str
    PUSH_ALLOWED_NETWORKS: str
    CLOUDTASKS_DEDUP_SECONDS: int
    CLOUDTASKS_MAX_TASK_BYTES: int
    OIDC_ISSUER: str
    REDIS_SENTINEL_PASSWORD: str

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not read since their setting last changed: the
        # annotated ones, or typos.
        if name not in _Conf.__annotations__:
            raise AttributeError(name)
        value = getattr(settings, f"TASKFORGE_{name}")
        self.__dict__[name] = value
        return value


conf = _Conf()


def _forget(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("TASKFORGE_"):
        conf.__dict__.pop(setting.removeprefix("TASKFORGE_"), None)


setting_changed.connect(_forget, dispatch_uid="taskforge.conf")
