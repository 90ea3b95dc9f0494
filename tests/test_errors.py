"""Errors outside the serializers: Django's own, unexpected ones, outages.

API.md: every non-2xx answer is `{"error": {"code", "message"}}` JSON, never
an HTML page or a traceback; the one exception is /readyz's 503 body.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from rest_framework import status
from rest_framework.test import APIClient

from queues.models import Queue
from queues.tests.factories import QueueFactory
from tests.helpers import assert_error, send_raw
from tests.urls_boom import SECRET

pytestmark = pytest.mark.django_db


def assert_no_internals(response: Any) -> None:
    text = response.content.decode()
    for leak in ("Traceback", "RuntimeError", "DatabaseError", 'File "', SECRET):
        assert leak not in text


@pytest.fixture
def queue() -> str:
    queue: Queue = QueueFactory(name="err-q")
    return queue.name


@pytest.fixture
def closed_postgres() -> Iterator[None]:
    """Point the default connection (and its pool, if any) at a closed port.

    Needs `django_db(transaction=True)`: the usual test transaction lives on
    the very connection this closes.  A pool waits `timeout` seconds for a
    connection before giving up, so the outage pool gets a short one.
    """
    saved = {key: connection.settings_dict[key] for key in ("PORT", "OPTIONS")}
    _close(connection)
    connection.settings_dict["PORT"] = 1
    options = dict(saved["OPTIONS"])
    if options.get("pool"):
        pool = options["pool"] if isinstance(options["pool"], dict) else {}
        options["pool"] = {**pool, "timeout": 0.3}
    connection.settings_dict["OPTIONS"] = options
    try:
        yield
    finally:
        _close(connection)
        connection.settings_dict.update(saved)


def _close(conn: Any) -> None:
    conn.close()
    if hasattr(conn, "close_pool"):
        conn.close_pool()


# 404 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/nope",
        "/queues/",  # APPEND_SLASH is off: no redirect to an HTML page either
        "/queues/err-q/nope",
        "/queues/err-q/tasks/0b5e6a2c-8f5d-4b8e-9d0a-6f1f2a3b4c5d/nope",
        "/api/schema",
        "/static/no-such-file.css",
        "/" + "x" * 5000,
    ],
)
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_unknown_path__is_json_not_found(path: str, method: str, admin_client: APIClient) -> None:
    response = admin_client.generic(method, path)

    assert_error(response, status.HTTP_404_NOT_FOUND, "not_found")


def test_unknown_path__without_a_key_is_json_not_found() -> None:
    response = Client().get("/nope", HTTP_ACCEPT="text/html")

    assert_error(response, status.HTTP_404_NOT_FOUND, "not_found")


# 405 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/queues", {"GET", "POST"}),
        ("DELETE", "/queues", {"GET", "POST"}),
        ("POST", "/queues/err-q", {"GET", "PATCH", "DELETE"}),
        ("PUT", "/queues/err-q", {"GET", "PATCH", "DELETE"}),
        ("GET", "/queues/err-q/pause", {"POST"}),
        ("DELETE", "/queues/err-q/stats", {"GET"}),
        ("PATCH", "/queues/err-q/tasks", {"GET", "POST"}),
        ("GET", "/queues/err-q/tasks/batch", {"POST"}),
        ("POST", "/queues/err-q/tasks/0b5e6a2c-8f5d-4b8e-9d0a-6f1f2a3b4c5d", {"GET", "DELETE"}),
        ("BREW", "/queues", {"GET", "POST"}),
    ],
)
def test_wrong_method__is_json_method_not_allowed(
    method: str, path: str, allow: set[str], queue: str, admin_client: APIClient
) -> None:
    response = admin_client.generic(method, path)

    assert_error(response, status.HTTP_405_METHOD_NOT_ALLOWED, "method_not_allowed")
    assert set(response["Allow"].split(", ")) - {"OPTIONS", "HEAD"} == allow


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/healthz"),
        ("PUT", "/readyz"),
        ("DELETE", "/healthz"),
        ("POST", "/api/schema/"),
        ("POST", "/api/docs/"),
    ],
)
def test_wrong_method__on_public_endpoints_is_json_too(method: str, path: str) -> None:
    """Regression: Django's require_GET answered an empty text/html 405, the
    schema view a YAML body and the docs view an HTML one."""
    client = Client(enforce_csrf_checks=True)  # as a real client: no CSRF token

    response = client.generic(method, path)

    assert_error(response, status.HTTP_405_METHOD_NOT_ALLOWED, "method_not_allowed")
    assert "GET" in response["Allow"]


def test_wrong_method__without_a_key_is_unauthenticated_first() -> None:
    """Authentication runs before the method check: no key learns nothing."""
    response = APIClient().put("/queues")

    assert_error(response, status.HTTP_401_UNAUTHORIZED, "unauthenticated")


# 400 and 403 raised outside DRF --------------------------------------------------


def test_disallowed_host__is_json_bad_request() -> None:
    response = Client(HTTP_HOST="evil.example").get("/queues")

    assert_error(response, status.HTTP_400_BAD_REQUEST, "invalid")


@pytest.mark.urls("tests.urls_boom")
@pytest.mark.parametrize(
    ("path", "code", "error_code"),
    [
        ("/boom/django/permission", status.HTTP_403_FORBIDDEN, "forbidden"),
        ("/boom/django/suspicious", status.HTTP_400_BAD_REQUEST, "invalid"),
        ("/boom/django/not-found", status.HTTP_404_NOT_FOUND, "not_found"),
    ],
)
def test_django_exceptions__in_plain_views_are_json(path: str, code: int, error_code: str) -> None:
    response = Client(raise_request_exception=False).get(path)

    assert_error(response, code, error_code)
    assert_no_internals(response)


# 500 ---------------------------------------------------------------------------


@pytest.mark.urls("tests.urls_boom")
@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/boom/api/runtime", id="RuntimeError in a DRF view"),
        pytest.param("/boom/api/database", id="DatabaseError in a DRF view"),
        pytest.param("/boom/django/runtime", id="RuntimeError in a plain Django view"),
    ],
)
def test_unexpected_exception__is_json_internal_without_traceback(path: str) -> None:
    response = Client(raise_request_exception=False).get(path)

    assert_error(response, status.HTTP_500_INTERNAL_SERVER_ERROR, "internal")
    assert_no_internals(response)


# 503 ---------------------------------------------------------------------------


@pytest.mark.urls("tests.urls_boom")
def test_redis_down__is_json_unavailable() -> None:
    response = Client().get("/boom/api/redis")

    assert_error(response, status.HTTP_503_SERVICE_UNAVAILABLE, "unavailable")
    assert response["Retry-After"]


@pytest.mark.django_db(transaction=True)
def test_postgres_down__api_is_json_unavailable_and_probes_tell(closed_postgres: None) -> None:
    """One test for the whole outage: a transactional test is slow to tear down."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer tf_any-key")  # lookup needs Postgres

    for method, path, body in [
        ("GET", "/queues", None),
        ("POST", "/queues", b'{"name": "q"}'),
        ("POST", "/queues/q/tasks", b'{"payload": 1}'),
    ]:
        response = send_raw(client, method, path, body or b"", content_type="application/json")
        assert_error(response, status.HTTP_503_SERVICE_UNAVAILABLE, "unavailable")
        assert response["Retry-After"]
        assert_no_internals(response)

    healthz = Client().get("/healthz")
    assert healthz.status_code == status.HTTP_200_OK
    assert healthz.json() == {"status": "ok"}

    readyz = Client().get("/readyz")
    assert readyz.status_code == status.HTTP_503_SERVICE_UNAVAILABLE
    assert readyz["Content-Type"] == "application/json"
    body = readyz.json()
    assert body["status"] == "unavailable"
    assert body["checks"] == {"postgres": "failed", "redis": "ok"}  # which, never why
    assert_no_internals(readyz)


# /healthz and /readyz ----------------------------------------------------------


def test_healthz__is_ok() -> None:
    response = Client().get("/healthz")

    assert response.status_code == status.HTTP_200_OK
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"status": "ok"}


def test_healthz__answers_head() -> None:
    assert Client().head("/healthz").status_code == status.HTTP_200_OK


def test_readyz__is_ok_when_postgres_and_redis_answer() -> None:
    response = Client().get("/readyz")

    assert response.status_code == status.HTTP_200_OK
    assert response.json() == {"status": "ok", "checks": {"postgres": "ok", "redis": "ok"}}


def test_readyz__redis_down_is_503_saying_which_not_why(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """API.md v1.1: a stranger learns which check failed; the reason goes to the log."""
    settings.REDIS_URL = "redis://127.0.0.1:1/8"

    response = Client().get("/readyz")

    assert response.status_code == status.HTTP_503_SERVICE_UNAVAILABLE
    assert response["Content-Type"] == "application/json"
    assert response.json() == {
        "status": "unavailable",
        "checks": {"postgres": "ok", "redis": "failed"},
    }
    assert b"127.0.0.1" not in response.content and b":1" not in response.content
    [failure] = [r for r in caplog.records if r.getMessage() == "readyz.check_failed"]
    assert failure.check == "redis" and failure.reason.startswith("error: ")  # type: ignore[attr-defined]


@pytest.mark.django_db
def test_readyz__an_admin_key_sees_why(settings: Any, make_client: Any) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/8"
    for role in ("producer", "admin"):
        body = make_client(role).get("/readyz").json()
        reason = body["checks"]["redis"]
        assert reason.startswith("error: ") if role == "admin" else reason == "failed", role


def test_readyz__checks_at_most_once_a_second(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/8"
    for _ in range(5):
        assert Client().get("/readyz").status_code == status.HTTP_503_SERVICE_UNAVAILABLE
    assert [r.getMessage() for r in caplog.records].count("readyz.check_failed") == 1


def test_readyz__postgres_down_is_503_with_checks() -> None:
    """The probe opens its own connection, so the test's transaction survives."""
    original = connection.settings_dict["PORT"]
    connection.settings_dict["PORT"] = 1
    try:
        response = Client().get("/readyz")
    finally:
        connection.settings_dict["PORT"] = original

    assert response.status_code == status.HTTP_503_SERVICE_UNAVAILABLE
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"] == {"postgres": "failed", "redis": "ok"}  # which, never why
    assert_no_internals(response)


# Content negotiation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, 200),
        ("*/*", 200),
        ("application/json", 200),
        ("application/json; indent=2", 200),
        ("text/html, application/json;q=0.9", 200),
        ("text/html", 406),
        ("application/xml", 406),
    ],
)
def test_accept__json_or_406(admin_client: APIClient, accept: str | None, expected: int) -> None:
    if accept is None:
        response = admin_client.get("/queues")
    else:
        response = admin_client.get("/queues", HTTP_ACCEPT=accept)
    assert response.status_code == expected, response.content
    assert response["Content-Type"] == "application/json"
    if expected == 406:
        assert_error(response, status.HTTP_406_NOT_ACCEPTABLE, "not_acceptable")
    elif accept and "indent" in accept:
        assert response.content.startswith(b"{\n  ")  # pretty, as DRF does it


def test_accept__format_query_parameter_is_still_drfs(admin_client: APIClient) -> None:
    assert admin_client.get("/queues?format=json").status_code == 200
    assert_error(admin_client.get("/queues?format=xml"), status.HTTP_404_NOT_FOUND, "not_found")
