"""TaskForge's tunables: one table of names, types and defaults.

`settings.py` reads each name from the environment with the type and default
given here.  Code reads the values through `conf` at call time, so tests can
change them with pytest-django's `settings` fixture.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

# name (without the TASKFORGE_ prefix) -> (type, default)
DEFAULTS: dict[str, tuple[type, Any]] = {
    "MAX_REQUEST_BYTES": (int, 10_485_760),
    "MAX_PAYLOAD_BYTES": (int, 262_144),
    "RETRY_BASE_MS": (int, 1000),
    "RETRY_MAX_DELAY_MS": (int, 3_600_000),
    "SCHEDULER_TICK_SECONDS": (float, 1.0),
    "DISPATCHER_TICK_SECONDS": (float, 1.0),  # fallback; NOTIFY wakes it sooner
    "BUFFER_SIZE": (int, 1000),  # buffered (claimed) tasks per queue in Redis
    "HEARTBEAT_TIMEOUT_SECONDS": (float, 30.0),
    "WATCHDOG_INTERVAL_SECONDS": (float, 15.0),
    "BUFFER_RECONCILE_SECONDS": (float, 30.0),
    "MAX_TICK_FAILURES": (int, 0),  # 0: a loop never gives up on its own
    "METRICS_TOKEN": (str, ""),
    "BIND": (str, "0.0.0.0:8080"),
}


class _Conf:
    """Attribute access to the TASKFORGE_* settings: `conf.RETRY_BASE_MS`."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(name)
        return getattr(settings, f"TASKFORGE_{name}")


conf = _Conf()
