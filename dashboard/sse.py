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
  dashboard cannot starve the API of threads;
- no longer than its user may see the dashboard: when the user is deactivated,
  loses staff status, is deleted or logs out, the stream ends within a second
  (`taskforge.api.revocation` names the user to every process).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth import get_user_model
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.http import HttpRequest, StreamingHttpResponse
from django.views.decorators.http import require_GET

from dashboard import roles, snapshot
from dashboard.views.base import requires
from taskforge.api import revocation

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


def events(
    *,
    lifetime: float,
    interval: float,
    user_id: object = None,
    allowed: Callable[[], bool] = lambda: True,
) -> Iterator[str]:
    """The stream's body: snapshots until `lifetime` is over (one when busy), or
    until `allowed()` says the user `user_id` may no longer see them."""
    # Taken on the first write, not in the view: a generator that never
    # starts never runs its `finally`, and would keep the slot forever.
    long_lived = _streams.acquire(blocking=False)
    woken = threading.Event()
    try:
        if not long_lived:
            yield f"retry: {BUSY_RETRY_MS}\n\n"
            yield _event(snapshot.current())
            return
        yield f"retry: {RETRY_MS}\n\n"
        deadline = time.monotonic() + lifetime
        with revocation.listener.watch(revocation.user_topic(user_id), woken):
            while True:
                yield _event(snapshot.current())
                _release_connection()
                if time.monotonic() + interval > deadline:
                    return
                if not _wait(woken, interval, allowed):
                    return
    finally:
        if long_lived:
            _streams.release()
        _release_connection()


# A logout publishes just before its session is deleted: look once more after this.
_RECHECK_SECONDS = 0.5


def _wait(woken: threading.Event, seconds: float, allowed: Callable[[], bool]) -> bool:
    """Sleep `seconds`; False as soon as the user turns out no longer allowed."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if woken.wait(left):
            woken.clear()
            if not allowed():
                return False
            recheck = min(_RECHECK_SECONDS, max(end - time.monotonic(), 0.0))
            if not woken.wait(recheck) and not allowed():
                return False
    if not revocation.listener.subscribed():
        return allowed()  # a message may have been missed: look at each snapshot
    return True


def still_allowed(request: HttpRequest) -> Callable[[], bool]:
    """Whether the request's staff user, in its session, may still see the dashboard."""
    user_id = request.user.pk
    assert user_id is not None  # staff_member_required let the request in
    session_key = request.session.session_key

    def check() -> bool:
        try:
            allowed = (
                get_user_model().objects.filter(pk=user_id, is_active=True, is_staff=True).exists()
            ) and (session_key is None or request.session.exists(session_key))
        finally:
            _release_connection()
        return allowed

    return check


@staff_member_required
@require_GET
@requires(roles.VIEW_QUEUES)
def stream(request: HttpRequest) -> StreamingHttpResponse:
    response = StreamingHttpResponse(
        events(
            lifetime=LIFETIME_SECONDS,
            interval=INTERVAL_SECONDS,
            user_id=request.user.pk,
            allowed=still_allowed(request),
        ),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events through unbuffered
    return response
