"""Is this server process stopping?  A flag that signal handlers set.

A long poll waiting for tasks (workers.protocol) reads it at least once a
second and answers what it has (nothing) instead of holding the shutdown for
up to `wait_seconds`.  Set by the servers' drain signals: run_api's (see
taskforge.api.server) and gunicorn's (gunicorn.conf.py).
"""

from __future__ import annotations

_stopping = False


def stop() -> None:
    """Say that this process is stopping.  Safe in a signal handler: it only sets a flag."""
    global _stopping
    _stopping = True


def stopping() -> bool:
    return _stopping
