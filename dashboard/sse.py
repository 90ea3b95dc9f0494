"""Server-sent events: the queue overview, live.

`GET /admin/dashboard/stream` answers `text/event-stream` and sends a
`snapshot` event (the JSON of `snapshot.current()`) right away and then every
`INTERVAL_SECONDS`.  What one stream may hold, and for how long:

- a gunicorn thread, for at most `LIFETIME_SECONDS`; then the response ends and
  the browser's EventSource reconnects by itself after `retry` ms.  A client
  that goes away is noticed at the next write (within one interval);
- no database connection between snapshots: the connection goes back to the
  pool (`connection.close()`) before each sleep;
- at most `MAX_STREAMS` long streams per process; past that a client gets one
  snapshot and a longer `retry`, i.e. it polls every `BUSY_RETRY_MS`, so the
  dashboard cannot starve the API of threads.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

from django.contrib.admin.views.decorators import staff_member_required
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.http import HttpRequest, StreamingHttpResponse
from django.views.decorators.http import require_GET

from dashboard import roles, snapshot
from dashboard.views.base import requires

INTERVAL_SECONDS = 2.0
LIFETIME_SECONDS = 180.0
RETRY_MS = 2000
BUSY_RETRY_MS = 10_000
MAX_STREAMS = 8

_streams = threading.BoundedSemaphore(MAX_STREAMS)


def _event(data: dict[str, object]) -> str:
    return f"event: snapshot\ndata: {json.dumps(data, cls=DjangoJSONEncoder)}\n\n"


def _release_connection() -> None:
    # Inside a test's transaction the connection must stay; in production no
    # atomic block is open here and the pool gets the connection back.
    if not connection.in_atomic_block:
        connection.close()


def events(*, lifetime: float, interval: float) -> Iterator[str]:
    """The stream's body: snapshots until `lifetime` is over (one when busy)."""
    # Taken on the first write, not in the view: a generator that never
    # starts never runs its `finally`, and would keep the slot forever.
    long_lived = _streams.acquire(blocking=False)
    try:
        if not long_lived:
            yield f"retry: {BUSY_RETRY_MS}\n\n"
            yield _event(snapshot.current())
            return
        yield f"retry: {RETRY_MS}\n\n"
        deadline = time.monotonic() + lifetime
        while True:
            yield _event(snapshot.current())
            _release_connection()
            if time.monotonic() + interval > deadline:
                return
            time.sleep(interval)
    finally:
        if long_lived:
            _streams.release()
        _release_connection()


@staff_member_required
@require_GET
@requires(roles.VIEW_QUEUES)
def stream(request: HttpRequest) -> StreamingHttpResponse:
    response = StreamingHttpResponse(
        events(lifetime=LIFETIME_SECONDS, interval=INTERVAL_SECONDS),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events through unbuffered
    return response
