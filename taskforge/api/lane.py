"""The hot lane: a plain JSON call to a hot endpoint, without the middleware chain's layers.

A call of the task lifecycle (taskforge.api.hot) with a plain JSON body goes
through Django's handler like any request, but not through MIDDLEWARE's
fourteen nested layers: the lane calls the hooks of the middleware that have
work to do for it, in the chain's order, and nothing of the five that pass a
hot call by (taskforge.api.middleware), nor of django-axes' (it answers a
sign-in that axes refused, and a hot call, by API key, never signs in).
Measured with two services side by side, calls interleaved (docs/operations.md,
"Serving model"): 11 % less API CPU per enqueue (median of 8 pairs), claim and
ack within the noise.

What the call's answer, its `http.request` log line and its metrics are is the
chain's, hook for hook (`MIRRORED` is the chain this was written against; a
test fails when MIDDLEWARE no longer matches it):

- request: the request log's clock, what django-prometheus's two
  `process_request` and its `process_view` count (`LaneMetrics.requested`), the
  view (the hot view's plain JSON path, `HotView.serve`); the known method,
  the body limit, Security's and Common's request hooks and CSRF's exemption
  are checked beforehand, in `takes`;
- answer: X-Frame-Options, Common, the security headers (ours, then
  Django's), what django-prometheus's two `process_response` count
  (`LaneMetrics.answered`), the log line.

A call that any request hook would answer itself (a body over its limit, a
Host not allowed, a redirect to HTTPS, a refused User-Agent) takes the whole
chain instead, decided before anything is counted, as does every other
request.  `ApiWSGIHandler` serves the lane (taskforge.wsgi, which taskforge.rsgi serves);
`LaneClientHandler` makes the test client take it, so the suite's API tests
go through it.

Under `run_api` a lane call skips WSGI's wrapping too: the server's thread
asks `ApiWSGIHandler.answer` for the whole answer, which does the request
signals' work itself and lets the thread keep its database connection for
its next lane call (`Parking`).  Measured with the services before and
after side by side, 6 load runs of 6 s on each in turn (8 producers, 8
workers, claim 1, ack 1), twice: API CPU per request 1.64 -> 1.54 and
1.62 -> 1.57 ms, 196 -> 213 and 187 -> 207 tasks/s (medians).
"""

from __future__ import annotations

import logging
import threading
import time
from functools import lru_cache
from typing import Any, cast

import django_prometheus.middleware as prometheus  # type: ignore[import-untyped]
from django.conf import settings
from django.core import signals
from django.core.cache import close_caches
from django.core.exceptions import DisallowedHost, PermissionDenied
from django.core.handlers.base import BaseHandler, reset_urlconf
from django.core.handlers.exception import response_for_exception
from django.core.handlers.wsgi import WSGIHandler, get_script_name
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections, reset_queries
from django.dispatch import Signal
from django.http import HttpRequest, HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.security import SecurityMiddleware
from django.urls import ResolverMatch, resolve, set_script_prefix, set_urlconf
from django.utils.log import log_response
from psycopg import pq
from rest_framework.test import ForceAuthClientHandler

from taskforge.api import headers, request_log
from taskforge.api.bridge import Answer
from taskforge.api.hot import is_plain_json_post
from taskforge.api.middleware import (
    KnownMethodMiddleware,
    PrometheusAfterMiddleware,
    body_limit,
    declared_length,
    is_hot_call,
    remember,
)
from taskforge.conf import conf
from taskforge.lib import internals, pg

logger = logging.getLogger(__name__)

# settings.MIDDLEWARE as the lane mirrors it (see the module's docstring).
MIRRORED = [
    "taskforge.api.request_log.RequestLogMiddleware",
    "taskforge.api.middleware.KnownMethodMiddleware",
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "taskforge.api.middleware.BodyLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "taskforge.api.headers.SecurityHeadersMiddleware",
    "taskforge.api.middleware.WhiteNoiseMiddleware",
    "taskforge.api.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "taskforge.api.middleware.CsrfViewMiddleware",
    "taskforge.api.middleware.AuthenticationMiddleware",
    "taskforge.api.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "taskforge.api.middleware.PrometheusAfterMiddleware",
    "axes.middleware.AxesMiddleware",
]


def _unused(request: HttpRequest) -> HttpResponse:
    raise AssertionError("the lane calls its middleware's hooks, never their chain")


@lru_cache(maxsize=4096)
def _resolved(path: str) -> ResolverMatch:
    """The URL's match; a hot path always resolves (is_hot_call matched it)."""
    return resolve(path)


class HotLane:
    """The middleware's hooks for a hot call, in the chain's order."""

    def __init__(self) -> None:
        self.methods = KnownMethodMiddleware(_unused)
        self.before = prometheus.PrometheusBeforeMiddleware(_unused)
        self.security = SecurityMiddleware(_unused)
        self.common = CommonMiddleware(_unused)
        self.xframe = XFrameOptionsMiddleware(_unused)
        self.after = PrometheusAfterMiddleware(_unused)
        self.metrics = LaneMetrics(self.after)

    def takes(self, request: HttpRequest) -> ResolverMatch | None:
        """The call's URL match if the lane answers it exactly as the chain would;
        None otherwise.  Counts nothing."""
        meta = request.META
        if self.methods.process_request(request) is not None:
            return None
        if not is_plain_json_post(meta) or not is_hot_call(request):
            return None
        match = _resolved(request.path_info)
        length = declared_length(request)
        if length is None or length > min(conf.MAX_REQUEST_BYTES, body_limit(match.func)):
            return None
        if not getattr(match.func, "csrf_exempt", False):
            return None
        if self.security.process_request(request) is not None:
            return None
        try:
            if self.common.process_request(request) is not None:
                return None
        except (DisallowedHost, PermissionDenied):
            return None
        return match

    def respond(self, request: HttpRequest, match: ResolverMatch) -> HttpResponse:
        started = time.perf_counter()
        view = self.metrics.requested(request, match)
        request.resolver_match = match
        try:
            response: HttpResponse = match.func(request, *match.args, **match.kwargs)
        except Exception as exc:
            self.after.process_exception(request, exc)
            response = response_for_exception(request, exc)
        response = self.xframe.process_response(request, response)
        # (Typed as any answer; this one is the view's HttpResponse still.)
        response = cast(HttpResponse, self.common.process_response(request, response))
        headers.add_security_headers(request, response)
        response = self.security.process_response(request, response)
        self.metrics.answered(request, response, view, started)
        request_log.log_request(request, response, started)
        return response


class LaneMetrics:
    """django-prometheus's five hooks for a lane call, as two calls.

    The chain counts a request in its Before and After middleware's
    `process_request`, the After's `process_view`, and both `process_response`:
    eight counter increments and four histogram observations, each child found
    through `labels()` (or our per-process cache of them) and each observation
    walking the histogram's buckets.  Here the children a call counts in are
    found once per view, method, transport and status, and an observation's
    bucket by bisection (internals.observe): the same series and the same
    values, the two latencies measured from the request log's clock reading
    (the chain's differ from these by the few microseconds between its
    hooks).  The five hooks took 105 us a call, these two 62 (timeit,
    multiprocess mode: most of the rest is the sixteen value writes).
    A view's exception is still counted by the After middleware's own hook.
    """

    def __init__(self, after: PrometheusAfterMiddleware) -> None:
        self.after = after
        self.m = after.metrics
        self._requests: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        self._answers: dict[tuple[str, str, int, str], tuple[Any, ...]] = {}

    def requested(self, request: HttpRequest, match: ResolverMatch) -> str:
        """Count the request as the hooks before the view do; its view's name."""
        after, m = self.after, self.m
        method = after._method(request)
        transport = after._transport(request)
        view = match.view_name or "<unnamed view>"
        key = (view, method, transport)
        counters = self._requests.get(key)
        if counters is None:
            counters = (
                m.requests_total,
                after.label_metric(m.requests_by_method, request, method=method),
                after.label_metric(m.requests_by_transport, request, transport=transport),
                after.label_metric(
                    m.requests_by_view_transport_method,
                    request,
                    view=view,
                    transport=transport,
                    method=method,
                ),
            )
            remember(self._requests, key, counters)
        for counter in counters:
            counter.inc()
        meta = request.META
        if meta.get("HTTP_X_REQUESTED_WITH") == "XMLHttpRequest":
            m.requests_ajax.inc()
        internals.observe(m.requests_body_bytes, int(meta.get("CONTENT_LENGTH") or 0))
        return view

    def answered(
        self, request: HttpRequest, response: HttpResponse, view: str, started: float
    ) -> None:
        """Count the answer as the hooks after the view do (`started`: perf_counter())."""
        after, m = self.after, self.m
        method = after._method(request)
        status = response.status_code
        charset = str(response.charset)
        key = (view, method, status, charset)
        found = self._answers.get(key)
        if found is None:
            label = str(status)
            found = (
                (
                    after.label_metric(m.responses_by_status, request, status=label),
                    after.label_metric(
                        m.responses_by_status_view_method,
                        request,
                        status=label,
                        view=view,
                        method=method,
                    ),
                    after.label_metric(m.responses_by_charset, request, charset=charset),
                    m.responses_total,
                ),
                after.label_metric(
                    m.requests_latency_by_view_method, request, view=view, method=request.method
                ),
            )
            remember(self._answers, key, found)
        counters, latency = found
        for counter in counters:
            counter.inc()
        if response.streaming:
            m.responses_streaming.inc()
        else:
            internals.observe(m.responses_body_bytes, len(response.content))
        elapsed = time.perf_counter() - started
        internals.observe(latency, elapsed)
        internals.observe(m.requests_latency_before, elapsed)


class HotLaneMixin(BaseHandler):
    """A handler whose `get_response` answers the lane's calls without the chain."""

    _lane: HotLane | None = None

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async)
        if settings.MIDDLEWARE == MIRRORED:
            self._lane = HotLane()

    def get_response(self, request: HttpRequest) -> HttpResponse:
        lane = self._lane
        match = lane.takes(request) if lane is not None else None
        if lane is None or match is None:
            return cast(HttpResponse, super().get_response(request))
        return self._lane_response(lane, request, match)

    @staticmethod
    def _lane_response(lane: HotLane, request: HttpRequest, match: ResolverMatch) -> HttpResponse:
        """BaseHandler.get_response, with the lane for the middleware chain."""
        set_urlconf(settings.ROOT_URLCONF)
        response = lane.respond(request, match)
        response._resource_closers.append(request.close)  # type: ignore[attr-defined]
        if response.status_code >= 400:
            log_response(
                "%s: %s", response.reason_phrase, request.path, response=response, request=request
            )
        return response


# Django's receivers of the request signals, whose work `ApiWSGIHandler.answer`
# does itself (the database connection's part differently: see `Parking`).
STARTED = frozenset({reset_queries, close_old_connections})
FINISHED = frozenset({close_old_connections, close_caches, reset_urlconf})


def receivers(signal: Signal, sender: type) -> frozenset[Any]:
    """The functions `signal` calls when `sender` sends it."""
    sync, asynchronous = signal._live_receivers(sender)
    return frozenset(sync) | frozenset(asynchronous)


class Parking:
    """Database connections kept by API threads between hot calls.

    Django gives a request's connection back to the pool when the request
    ends and takes one again for the next (the request signals): with
    psycopg's pool that round (Django's connect and close, the pool's
    checks) was a tenth of a hot call's API CPU.  A thread that ends a hot
    call may instead keep its connection for its next one, while fewer than
    `limit` threads of the process keep one: the rest of the pool
    (DATABASE_POOL_MAX - limit connections at least) goes round as before,
    so a thread that needs a connection never waits on an idle thread's.

    Only a connection in a clean state is kept (autocommit, no transaction,
    no error since its last use), and for at most `max_age` seconds from
    when it was first kept, so the pool still replaces its connections now
    and then.  Any other request on the thread gives it back (Django's
    request_started closes it), as does a long poll before it waits.
    """

    def __init__(self, limit: int, max_age: float = 60.0) -> None:
        self.limit = limit
        self.max_age = max_age
        self.count = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    def resume(self) -> bool:
        """At the start of a request: this thread's kept connection, if it has
        one, is in use again; did it have one (and is it still trusted)?

        A connection kept before a request met a broken one (Postgres
        restarted, a proxy cut its sessions: `pg.check_pool_soon`) is closed
        instead, for the pool to replace: the pool's idle connections are
        repaired at once, and these would each fail a request of their own.
        """
        local = self._local
        if not getattr(local, "kept", False):
            return False
        local.kept = False
        with self._lock:
            self.count -= 1
        if local.broken_seen == pg.broken_seen():
            return True
        # Closed first, so the pool drops it rather than take it back as idle (a
        # dead connection is not known dead until it is used).
        conn = connections[DEFAULT_DB_ALIAS]
        try:
            if conn.connection is not None:
                conn.connection.close()
            conn.close()
        except Exception as exc:
            logger.debug("lane.kept_connection_close_failed", extra={"error": repr(exc)})
        return False

    def release(self) -> bool:
        """At the end of a hot call: keep this thread's connection if allowed."""
        if self.limit <= 0:
            return False
        conn = connections[DEFAULT_DB_ALIAS]
        raw = conn.connection
        if (
            raw is None
            or conn.in_atomic_block
            or conn.errors_occurred
            or not conn.get_autocommit()
            or raw.info.transaction_status != pq.TransactionStatus.IDLE
        ):
            return False
        local = self._local
        now = time.monotonic()
        if getattr(local, "raw", None) is not raw:
            local.raw, local.since = raw, now
        elif now - local.since > self.max_age:
            return False
        with self._lock:
            if self.count >= self.limit:
                return False
            self.count += 1
        local.kept = True
        local.broken_seen = pg.broken_seen()
        return True


class ApiWSGIHandler(HotLaneMixin, WSGIHandler):
    """Django's WSGI handler, with the hot lane."""

    parking: Parking | None = None

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async)
        if (
            self._lane is not None
            and receivers(signals.request_started, type(self)) == STARTED
            and receivers(signals.request_finished, type(self)) == FINISHED
        ):
            # Without a pool (DATABASE_POOL_MAX=0) the limit is 0: nothing is kept.
            self.parking = Parking(limit=settings.DATABASE_POOL_MAX // 2)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if self.parking is not None:
            self.parking.resume()  # request_started closes the kept connection
        return super().__call__(environ, start_response)

    def answer(self, environ: dict[str, Any]) -> Answer | None:
        """The whole answer to a call the lane takes, or None for any other request
        (serve it through `__call__`).

        What `__call__` and the answer's `close()` do around `get_response`,
        without their generic parts: the request signals' receivers (STARTED,
        FINISHED: checked when the handler loads, else this answers None), and
        the thread's connection kept for its next hot call (`Parking`).
        """
        lane, parking = self._lane, self.parking
        if lane is None or parking is None or not is_plain_json_post(environ):
            return None  # (the WSGI environ is the request's META)
        request = self.request_class(environ)
        match = lane.takes(request)
        if match is None:
            return None
        set_script_prefix(get_script_name(environ))
        reset_queries()
        if not parking.resume():
            close_old_connections()
        try:
            response = self._lane_response(lane, request, match)
            headers = [
                *response.items(),
                *(("Set-Cookie", c.output(header="")) for c in response.cookies.values()),
            ]
            answer = (response.status_code, headers, response.content)
            for closer in response._resource_closers:  # type: ignore[attr-defined]
                closer()
        finally:
            if not parking.release():
                close_old_connections()
            close_caches()
            reset_urlconf(None)
        return answer


class LaneClientHandler(HotLaneMixin, ForceAuthClientHandler):  # type: ignore[misc]
    """DRF's test client handler, with the hot lane (as the servers run it)."""
