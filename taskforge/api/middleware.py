"""The API's own middleware: known methods only, bounded bodies, bounded metric labels.

Known methods (API.md, "Security (v1.2)"): a request whose method is not one
of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS is answered 405
`method_not_allowed` on every path, before authentication, and counted in no
metric (`KnownMethodMiddleware`, ahead of django-prometheus's middleware).

Bounded bodies: a request over its endpoint's limit is refused before it is read.

API.md v1.1 ("bounded parsing"): 413 `payload_too_large` for a single-task body
(enqueue, heartbeat, ack, nack) over twice TASKFORGE_MAX_PAYLOAD_BYTES plus
4096 bytes, and for any body over TASKFORGE_MAX_REQUEST_BYTES.  A declared
Content-Length is checked first; a chunked body (no Content-Length) is counted
while it is read and refused as soon as it passes the limit, so neither kind
costs more memory than its endpoint allows.  A view says which limit is its
own with `body_limit = SINGLE_TASK` (on the class of a DRF view, or on a
function view); every other view has TASKFORGE_MAX_REQUEST_BYTES.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any

import django_prometheus.middleware  # type: ignore[import-untyped]  # no annotations
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware as _Authentication
from django.contrib.messages.middleware import MessageMiddleware as _Messages
from django.contrib.sessions.middleware import SessionMiddleware as _Sessions
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import CsrfViewMiddleware as _Csrf
from django.urls import Resolver404, URLPattern, get_resolver
from rest_framework.views import APIView
from whitenoise.middleware import WhiteNoiseMiddleware as _WhiteNoise  # type: ignore[import-untyped]

from taskforge.api.responses import error_response
from taskforge.conf import conf

SINGLE_TASK = "single_task"

# The methods a request may have (API.md, "Security (v1.2)").
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_UNKNOWN_METHOD = "The method is not one of " + ", ".join(sorted(KNOWN_METHODS)) + "."

# A chunked body is read in pieces of this size.
_CHUNK = 64 * 1024


def single_task_limit() -> int:
    """The largest body a single-task call may send: its payload or result twice
    over (JSON escapes) plus room for the other fields."""
    return 2 * conf.MAX_PAYLOAD_BYTES + 4096


def body_limit(view: Callable[..., Any] | None) -> int:
    """The body limit of `view` (see the module's docstring)."""
    owner = getattr(view, "cls", view)  # DRF's as_view() keeps the class as `cls`
    if getattr(owner, "body_limit", None) == SINGLE_TASK:
        return min(single_task_limit(), conf.MAX_REQUEST_BYTES)
    return conf.MAX_REQUEST_BYTES


def _too_large(limit: int) -> HttpResponse:
    return error_response(
        413, "payload_too_large", f"The request body is larger than {limit} bytes."
    )


def declared_length(request: HttpRequest) -> int | None:
    raw = request.META.get("CONTENT_LENGTH")
    if raw and raw.isascii() and raw.isdigit():
        return int(raw)
    return None


def _chunked_input(request: HttpRequest) -> Any:
    """The stream of a chunked body without Content-Length, or None.

    Under WSGI, only a server that says it ends the input at the body's end
    (`wsgi.input_terminated`, as gunicorn does) lets us read it; any other
    request without Content-Length has no body to Django.
    """
    if declared_length(request) is not None:
        return None
    if "chunked" not in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
        return None
    if "wsgi.input" in request.META:
        return request.META["wsgi.input"] if request.META.get("wsgi.input_terminated") else None
    return getattr(request, "_stream", None)  # ASGI: the server's (spooled) body


class KnownMethodMiddleware:
    """405 `method_not_allowed` for a method not in KNOWN_METHODS, on every path.

    Ahead of everything but the request log (which logs the refusal): the
    method is never a metric's label, and no authentication, session or view
    runs for it.  Django upper-cases the method, so `get` is GET.  Where the
    path names an API view, `Allow` lists its methods, as the view's own 405
    does.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.process_request(request) or self.get_response(request)

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        if request.method in KNOWN_METHODS:
            return None
        response = error_response(405, "method_not_allowed", _UNKNOWN_METHOD)
        allow = _allow(request)
        if allow is not None:
            response["Allow"] = allow
        return response


def _allow(request: HttpRequest) -> str | None:
    """The `Allow` header of the API view the request's path names, as its own 405
    says it; None for any other path (Django admin's, a function view's, none)."""
    from taskforge.api.hot import allow_header  # the views import this module

    urlconf = getattr(request, "urlconf", None) or settings.ROOT_URLCONF
    try:
        match = get_resolver(urlconf).resolve(request.path_info)
    except Resolver404:
        return None
    owner = getattr(match.func, "cls", None)  # DRF's as_view() keeps the class as `cls`
    if not (isinstance(owner, type) and issubclass(owner, APIView)):
        return None
    return allow_header(owner())


class BodyLimitMiddleware:
    """413 `payload_too_large` before a body over its endpoint's limit is read."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # The request-wide limit first: it needs no URL resolution.
        length = declared_length(request)
        if length is not None and length > conf.MAX_REQUEST_BYTES:
            return _too_large(conf.MAX_REQUEST_BYTES)
        return self.get_response(request)

    def process_view(
        self,
        request: HttpRequest,
        view: Callable[..., Any],
        args: Any,
        kwargs: Any,
    ) -> HttpResponse | None:
        limit = body_limit(view)
        length = declared_length(request)
        if length is not None:
            return _too_large(limit) if length > limit else None
        stream = _chunked_input(request)
        if stream is None:
            return None
        # Count while reading; stop one byte past the limit.
        pieces: list[bytes] = []
        size = 0
        while size <= limit:
            piece = stream.read(min(_CHUNK, limit + 1 - size))
            if not piece:
                break
            pieces.append(piece)
            size += len(piece)
        if size > limit:
            return _too_large(limit)
        body = b"".join(pieces)
        # From here on the request reads as if it had said its Content-Length.
        request.META["CONTENT_LENGTH"] = str(len(body))
        request._stream = io.BytesIO(body)
        return None


class PrometheusAfterMiddleware(django_prometheus.middleware.PrometheusAfterMiddleware):  # type: ignore[misc]
    """django-prometheus's, with each labelled child looked up once per process.

    It counts a request in seven labelled metrics, and `metric.labels(...)`
    checks and joins the label values and takes the metric's lock every time
    (a sixth of the middleware's CPU per request).  The children are the ones
    `labels()` returns: the same series, the same values.  Their labels are
    view names (from the URLconf: a path that resolves to none is
    `<unnamed view>`), methods, statuses, charsets and exception types, none
    of them free text from the request: django-prometheus labels its latency
    histogram by the raw method, which `bounded_labels` names
    `<invalid method>` here when it is not a known one (KnownMethodMiddleware
    refuses such a request before it gets here).  At most CHILDREN_KEPT
    children are remembered (`remember`), whatever comes.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._children: dict[tuple[Any, ...], Any] = {}

    def process_request(self, request: HttpRequest) -> None:
        # django-prometheus's, reading the two headers from META: `request.headers`
        # builds a mapping of every header on first use, for two lookups.
        meta = request.META
        method = self._method(request)
        self.label_metric(self.metrics.requests_by_method, request, method=method).inc()
        transport = self._transport(request)
        self.label_metric(self.metrics.requests_by_transport, request, transport=transport).inc()
        if meta.get("HTTP_X_REQUESTED_WITH") == "XMLHttpRequest":
            self.label_metric(self.metrics.requests_ajax, request).inc()
        length = meta.get("CONTENT_LENGTH") or 0
        self.label_metric(self.metrics.requests_body_bytes, request).observe(int(length))
        request.prometheus_after_middleware_event = django_prometheus.middleware.Time()  # type: ignore[attr-defined]

    def label_metric(self, metric: Any, request: Any, response: Any = None, **labels: Any) -> Any:
        if not labels:
            return metric
        key = (id(metric), *labels.items())
        child = self._children.get(key)
        if child is None:
            # Two threads may race here; both get the same child from `labels()`.
            child = remember(self._children, key, metric.labels(**bounded_labels(labels)))
        return child


# Children remembered by one cache of them, at most: far more than the label values
# of TaskForge's URLconf, statuses and methods make, and a few hundred KiB.
CHILDREN_KEPT = 4096

# django-prometheus's label for a method it does not know.
INVALID_METHOD = "<invalid method>"


def remember(children: dict[Any, Any], key: Any, child: Any) -> Any:
    """`child`, kept in `children` under `key` while it holds fewer than CHILDREN_KEPT."""
    if len(children) < CHILDREN_KEPT:
        children[key] = child
    return child


def bounded_labels(labels: dict[str, Any]) -> dict[str, Any]:
    """`labels` with a `method` not in KNOWN_METHODS named INVALID_METHOD."""
    if "method" in labels and labels["method"] not in KNOWN_METHODS:
        return {**labels, "method": INVALID_METHOD}
    return labels


# --- hot calls: the middleware only people's pages need, passed by ---------------------

# URLconf -> the paths of its hot endpoints (taskforge.api.hot), as regexes.
_hot_routes: dict[str, list[re.Pattern[str]]] = {}


def _routes(urlconf: str) -> list[re.Pattern[str]]:
    routes = _hot_routes.get(urlconf)
    if routes is None:
        from taskforge.api.hot import HotView  # the views import this module

        routes = []
        for pattern in get_resolver(urlconf).url_patterns:
            view_class = getattr(getattr(pattern, "callback", None), "view_class", None)
            if isinstance(pattern, URLPattern) and view_class and issubclass(view_class, HotView):
                routes.append(re.compile("^/" + pattern.pattern.regex.pattern.lstrip("^")))
        _hot_routes[urlconf] = routes
    return routes


def is_hot_call(request: HttpRequest) -> bool:
    """A POST to a hot endpoint: an API call by key, for which the static files,
    sessions, CSRF, user authentication and messages middleware have nothing to do."""
    hot: bool | None = request.__dict__.get("_taskforge_hot_call")
    if hot is None:
        urlconf = getattr(request, "urlconf", None) or settings.ROOT_URLCONF
        path = request.path_info
        hot = request.method == "POST" and any(route.match(path) for route in _routes(urlconf))
        request._taskforge_hot_call = hot  # type: ignore[attr-defined]
    return hot


def _passing_hot_calls(base: type[Any]) -> type[Any]:
    """`base`, a middleware that a hot call goes straight through.

    The five middleware so wrapped only serve the dashboard, Django admin and
    static files: together about 30 us per call, out of a single-task
    request's ~1 ms.  What a hot call's answer carries stays the same (no
    cookie, session or message is ever part of it; tests/test_hot_parity.py
    compares its headers with a DRF answer's); their `process_view` hooks
    still run, and CSRF's lets an exempt view through as before.
    """

    def __call__(self: Any, request: HttpRequest) -> Any:
        if is_hot_call(request):
            return self.get_response(request)
        return base.__call__(self, request)

    return type(
        base.__name__,
        (base,),
        {
            "__call__": __call__,
            "__module__": __name__,
            "__doc__": f"{base.__module__}.{base.__name__}, passing hot calls straight through.",
        },
    )


WhiteNoiseMiddleware = _passing_hot_calls(_WhiteNoise)
SessionMiddleware = _passing_hot_calls(_Sessions)
CsrfViewMiddleware = _passing_hot_calls(_Csrf)
AuthenticationMiddleware = _passing_hot_calls(_Authentication)
MessageMiddleware = _passing_hot_calls(_Messages)
