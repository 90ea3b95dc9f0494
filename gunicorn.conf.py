"""gunicorn settings for the TaskForge API: `gunicorn taskforge.wsgi -c gunicorn.conf.py`.

API.md v1's way to serve the API, kept as an alternative to `manage.py run_api`
(granian: see taskforge.api.server and docs/operations.md, "Serving model").

Long polls (`POST /workers/claim` with `wait_seconds` up to 30) hold a
request open while waiting; threaded workers (gthread) let one process hold
many of them while other requests go on.  Each process starts one Redis
subscriber thread that wakes its waiting polls.

Stopping drains: a worker told to stop (SIGTERM)
ends its waiting long polls within a second (they answer empty), lets the
requests in flight finish, and exits; `graceful_timeout` bounds it.
"""

from __future__ import annotations

import gc
import os
import signal
from types import FrameType
from typing import Any

# TaskForge's settings, read once by taskforge/settings.py (TASKFORGE_TRUST_PROXY).
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskforge.settings")

from django.conf import settings

from taskforge import metrics
from taskforge.api.server import ServerSettings

# The server's own settings (README, Configuration) as `run_api` reads them:
# taskforge.api.server is their one reader, with their one default each.
_server = ServerSettings.from_environ()
bind = _server.bind
worker_class = "gthread"
workers = _server.workers
# Idle long polls cost a thread each (no CPU); threads start as needed.
threads = _server.threads
# A long poll lasts at most 30 s; past 60 s a request is stuck, not waiting.
timeout = 60
# Stopping: waiting long polls end within 1 s, other requests are short.
graceful_timeout = 10
keepalive = 30
# X-Forwarded-Proto (and the other forwarded headers) count only from a proxy the
# deployment says is in front (TASKFORGE_TRUST_PROXY, as settings.py reads it for
# Django's SECURE_PROXY_SSL_HEADER); gunicorn's default trusts any client on localhost.
forwarded_allow_ips = "*" if settings.TASKFORGE_TRUST_PROXY else ""
# A request header whose name contains "_" is dropped (API.md, Security v1.2), so
# `X_Forwarded_Proto` never stands in for `X-Forwarded-Proto`: gunicorn's default
# since 22, set here so no version or command line changes it.  No header is
# exempt, not even from the trusted proxy: forwarder_headers' default would let
# SCRIPT_NAME and PATH_INFO through as environ keys.
header_map = "drop"
forwarder_headers = ""
# Request logs go through Django's JSON logging; gunicorn's own errors to stderr.
accesslog = None
errorlog = "-"
loglevel = os.environ.get("LOG_LEVEL", "info").lower()
# Recycle workers now and then so a slow leak cannot grow without bound.
max_requests = 100_000
max_requests_jitter = 10_000

# Multiprocess metrics: drop a dead worker's live gauges, keep its counts.
child_exit = metrics.child_exit


def post_worker_init(worker: Any) -> None:
    """Drain on SIGTERM and SIGINT; keep the garbage collector off startup's objects.

    gunicorn's worker quits at once on SIGINT (dropping requests in flight)
    and, on SIGTERM, waits for every request, long polls included (up to
    30 s each).  Both now end the waiting long polls first
    (`workers.protocol.stop_waiting`, a flag) and then stop as on SIGTERM.

    The ~90k objects Django, DRF and the URLconf leave at import live as
    long as the process; a full collection scanned them all, a 50-60 ms
    pause for every request in flight (measured here).  Frozen, the pauses
    stay under ~10 ms; a first generation of 10,000 allocations instead of
    700 makes collections ~10x rarer for the same work (GC time per
    request: 0.07 -> 0.04 ms).
    """
    from workers.protocol import stop_waiting

    def drain(signum: int, frame: FrameType | None) -> None:
        stop_waiting()
        worker.handle_exit(signum, frame)

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)

    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


# gunicorn 27's control socket sits at one path per user; two servers on a
# host would fight over it, and TaskForge does not use it.
control_socket_disable = True
