"""taskforge.urls plus views that fail on purpose, for tests/test_errors.py.

Used with `@pytest.mark.urls("tests.urls_boom")`; the error handlers are
re-exported because Django reads them from the root urlconf.
"""

from __future__ import annotations

from typing import Any

import redis
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from taskforge.urls import handler400, handler403, handler404, handler500
from taskforge.urls import urlpatterns as taskforge_urlpatterns

__all__ = ["handler400", "handler403", "handler404", "handler500", "urlpatterns"]

SECRET = "s3cr3t-internal-detail"
CLOSED_REDIS = "redis://127.0.0.1:1/0"


class _OpenView(APIView):
    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]


class RuntimeErrorView(_OpenView):
    def get(self, request: Request) -> Response:
        raise RuntimeError(f"unexpected: {SECRET}")


class DatabaseErrorView(_OpenView):
    def get(self, request: Request) -> Response:
        raise DatabaseError(f"relation {SECRET} does not exist")


class RedisDownView(_OpenView):
    def get(self, request: Request) -> Response:
        client = redis.Redis.from_url(CLOSED_REDIS, socket_connect_timeout=1)
        try:
            client.ping()  # a real connection to a closed port
        finally:
            client.close()
        return Response({})


def django_runtime_error(request: HttpRequest) -> HttpResponse:
    raise RuntimeError(f"unexpected: {SECRET}")


def django_permission_denied(request: HttpRequest) -> HttpResponse:
    raise PermissionDenied(SECRET)


def django_suspicious(request: HttpRequest) -> HttpResponse:
    raise SuspiciousOperation(SECRET)


def django_not_found(request: HttpRequest) -> HttpResponse:
    raise Http404(SECRET)


urlpatterns = [
    *taskforge_urlpatterns,
    path("boom/api/runtime", RuntimeErrorView.as_view()),
    path("boom/api/database", DatabaseErrorView.as_view()),
    path("boom/api/redis", RedisDownView.as_view()),
    path("boom/django/runtime", django_runtime_error),
    path("boom/django/permission", django_permission_denied),
    path("boom/django/suspicious", django_suspicious),
    path("boom/django/not-found", django_not_found),
]
