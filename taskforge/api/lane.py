"""The hot lane: a plain JSON call to a hot endpoint, without the middleware chain's layers.

A call of the task lifecycle (taskforge.api.hot) with a plain JSON body goes
through Django's handler like any request, but not through MIDDLEWARE's
thirteen nested layers: the lane calls the hooks of the middleware that have
work to do for it, in the chain's order, and nothing of the five that pass a
hot call by (taskforge.api.middleware).  Measured with two services side by
side, calls interleaved (docs/operations.md, "Serving model"): 11 % less API
CPU per enqueue (median of 8 pairs), claim and ack within the noise.

What the call's answer, its `http.request` log line and its metrics are is the
chain's, hook for hook (`MIRRORED` is the chain this was written against; a
test fails when MIDDLEWARE no longer matches it):

- request: the request log's clock, django-prometheus's two `process_request`,
  its `process_view`, the view (the hot view's plain JSON path, `HotView.serve`);
  the body limit, Security's and Common's request hooks and CSRF's exemption
  are checked beforehand, in `takes`;
- answer: django-prometheus (after), X-Frame-Options, Common, the security
  headers (ours, then Django's), django-prometheus (before), the log line.

A call that any request hook would answer itself (a body over its limit, a
Host not allowed, a redirect to HTTPS, a refused User-Agent) takes the whole
chain instead, decided before anything is counted, as does every other
request.  `ApiWSGIHandler` serves the lane (taskforge.wsgi, which taskforge.rsgi serves);
`LaneClientHandler` makes the test client take it, so the suite's API tests
go through it.
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import cast

import django_prometheus.middleware as prometheus  # type: ignore[import-untyped]
from django.conf import settings
from django.core.exceptions import DisallowedHost, PermissionDenied
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import response_for_exception
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, HttpResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.security import SecurityMiddleware
from django.urls import ResolverMatch, resolve, set_urlconf
from django.utils.log import log_response
from rest_framework.test import ForceAuthClientHandler

from taskforge.api import headers, request_log
from taskforge.api.hot import is_plain_json_post
from taskforge.api.middleware import (
    PrometheusAfterMiddleware,
    body_limit,
    declared_length,
    is_hot_call,
)
from taskforge.conf import conf

# settings.MIDDLEWARE as the lane mirrors it (see the module's docstring).
MIRRORED = [
    "taskforge.api.request_log.RequestLogMiddleware",
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
        self.before = prometheus.PrometheusBeforeMiddleware(_unused)
        self.security = SecurityMiddleware(_unused)
        self.common = CommonMiddleware(_unused)
        self.xframe = XFrameOptionsMiddleware(_unused)
        self.after = PrometheusAfterMiddleware(_unused)

    def takes(self, request: HttpRequest) -> ResolverMatch | None:
        """The call's URL match if the lane answers it exactly as the chain would;
        None otherwise.  Counts nothing."""
        meta = request.META
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
        self.before.process_request(request)
        self.after.process_request(request)
        request.resolver_match = match
        self.after.process_view(request, match.func, match.args, match.kwargs)
        try:
            response: HttpResponse = match.func(request, *match.args, **match.kwargs)
        except Exception as exc:
            self.after.process_exception(request, exc)
            response = response_for_exception(request, exc)
        response = self.after.process_response(request, response)
        response = self.xframe.process_response(request, response)
        # (Typed as any answer; this one is the view's HttpResponse still.)
        response = cast(HttpResponse, self.common.process_response(request, response))
        headers.add_security_headers(request, response)
        response = self.security.process_response(request, response)
        response = self.before.process_response(request, response)
        request_log.log_request(request, response, started)
        return response


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
        # BaseHandler.get_response, with the lane for the middleware chain.
        set_urlconf(settings.ROOT_URLCONF)
        response = lane.respond(request, match)
        response._resource_closers.append(request.close)  # type: ignore[attr-defined]
        if response.status_code >= 400:
            log_response(
                "%s: %s", response.reason_phrase, request.path, response=response, request=request
            )
        return response


class ApiWSGIHandler(HotLaneMixin, WSGIHandler):
    """Django's WSGI handler, with the hot lane."""


class LaneClientHandler(HotLaneMixin, ForceAuthClientHandler):  # type: ignore[misc]
    """DRF's test client handler, with the hot lane (as the servers run it)."""
