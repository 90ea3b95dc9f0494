"""Authentication and the role matrix of API.md "Authentication".

The matrix is one table: a new endpoint is one more row of ENDPOINTS.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.urls import URLPattern
from rest_framework import status
from rest_framework.response import Response
from rest_framework.test import APIClient

from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge import urls
from taskforge.api.models import ApiKey
from tasks.models import Schedule, Task, TaskEvent
from tasks.tests.factories import ScheduleFactory, TaskFactory
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

PRODUCER, WORKER, ADMIN = "producer", "worker", "admin"
ROLES = (PRODUCER, WORKER, ADMIN)
ANY = frozenset(ROLES)
PRODUCERS = frozenset({PRODUCER, ADMIN})
WORKERS = frozenset({WORKER, ADMIN})
ADMINS = frozenset({ADMIN})


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # {queue}: a queue holding {task}; {empty}: a queue with no task
    allowed: frozenset[str]
    # What an allowed role gets with `body`; None: anything but 401, 403 or 5xx.
    success: int | None
    body: Any = None  # "{task}" in it is replaced too

    @property
    def id(self) -> str:
        return f"{self.method} {self.path}"


ENDPOINTS = [
    Endpoint("GET", "/queues", ANY, status.HTTP_200_OK),
    Endpoint("POST", "/queues", ADMINS, status.HTTP_201_CREATED, {"name": "brand-new"}),
    Endpoint("GET", "/queues/{queue}", ANY, status.HTTP_200_OK),
    Endpoint("PATCH", "/queues/{queue}", ADMINS, status.HTTP_200_OK, {"max_retries": 7}),
    Endpoint("DELETE", "/queues/{empty}", ADMINS, status.HTTP_204_NO_CONTENT),
    Endpoint("POST", "/queues/{queue}/pause", ADMINS, status.HTTP_200_OK),
    Endpoint("POST", "/queues/{queue}/resume", ADMINS, status.HTTP_200_OK),
    Endpoint("POST", "/queues/{queue}/purge", ADMINS, status.HTTP_200_OK),
    Endpoint("GET", "/queues/{queue}/stats", PRODUCERS, status.HTTP_200_OK),
    Endpoint("GET", "/queues/{queue}/keys", PRODUCERS, status.HTTP_200_OK),
    Endpoint("GET", "/queues/{queue}/tasks", PRODUCERS, status.HTTP_200_OK),
    Endpoint("POST", "/queues/{queue}/tasks", PRODUCERS, status.HTTP_201_CREATED, {"payload": 1}),
    Endpoint(
        "POST",
        "/queues/{queue}/tasks/batch",
        PRODUCERS,
        status.HTTP_201_CREATED,
        {"tasks": [{"payload": 1}, {"payload": 2}]},
    ),
    Endpoint("GET", "/queues/{queue}/tasks/{task}", PRODUCERS, status.HTTP_200_OK),
    Endpoint("DELETE", "/queues/{queue}/tasks/{task}", PRODUCERS, status.HTTP_200_OK),
    Endpoint("GET", "/queues/{queue}/tasks/{task}/events", PRODUCERS, status.HTTP_200_OK),
    # The DLQ and worker endpoints: their answers have their own tests; here
    # only who may call them.
    Endpoint("GET", "/queues/{queue}/dlq", ADMINS, None),
    Endpoint("POST", "/queues/{queue}/dlq/replay", ADMINS, None, {"all": True}),
    Endpoint("POST", "/queues/{queue}/dlq/{task}/replay", ADMINS, None),
    Endpoint("DELETE", "/queues/{queue}/dlq/{task}", ADMINS, None),
    Endpoint("GET", "/queues/{queue}/schedules", ADMINS, status.HTTP_200_OK),
    Endpoint(
        "POST",
        "/queues/{queue}/schedules",
        ADMINS,
        status.HTTP_201_CREATED,
        {"name": "hourly", "cron": "@hourly", "payload": 1},
    ),
    Endpoint("GET", "/queues/{queue}/schedules/{schedule}", ADMINS, status.HTTP_200_OK),
    Endpoint(
        "PATCH",
        "/queues/{queue}/schedules/{schedule}",
        ADMINS,
        status.HTTP_200_OK,
        {"paused": True},
    ),
    Endpoint("DELETE", "/queues/{queue}/schedules/{schedule}", ADMINS, status.HTTP_204_NO_CONTENT),
    Endpoint("GET", "/workers", ADMINS, None),
    Endpoint("GET", "/audit", ADMINS, status.HTTP_200_OK),
    Endpoint("POST", "/workers/claim", WORKERS, None, {"worker_id": "w", "queues": ["auth-empty"]}),
    Endpoint("POST", "/workers/heartbeat", WORKERS, None, {"worker_id": "w", "task_id": "{task}"}),
    Endpoint("POST", "/workers/ack", WORKERS, None, {"worker_id": "w", "task_id": "{task}"}),
    Endpoint(
        "POST",
        "/workers/nack",
        WORKERS,
        None,
        {"worker_id": "w", "task_id": "{task}", "error": "x"},
    ),
    Endpoint(
        "POST",
        "/workers/heartbeat/batch",
        WORKERS,
        None,
        {"worker_id": "w", "items": [{"task_id": "{task}"}]},
    ),
    Endpoint(
        "POST",
        "/workers/ack/batch",
        WORKERS,
        None,
        {"worker_id": "w", "items": [{"task_id": "{task}"}]},
    ),
]

PUBLIC_PATHS = ["/healthz", "/readyz", "/api/schema/", "/api/docs/"]
# Routes outside the API-key scheme (/metrics has its own optional token).
PUBLIC_ROUTE_NAMES = {"healthz", "readyz", "metrics", "schema", "docs"}


@pytest.fixture
def paths(redis_client: Any) -> dict[str, str]:
    """A queue holding a pending task, and an empty queue; Redis starts empty."""
    task = TaskFactory(queue=QueueFactory(name="auth-q"))
    QueueFactory(name="auth-empty")
    ScheduleFactory(queue=task.queue, name="nightly")
    return {"queue": "auth-q", "empty": "auth-empty", "task": str(task.id), "schedule": "nightly"}


def send(client: APIClient, endpoint: Endpoint, paths: dict[str, str]) -> Response:
    path = endpoint.path.format(**paths)
    if endpoint.body is None:
        return client.generic(endpoint.method, path)
    body = json.dumps(endpoint.body).replace("{task}", paths["task"])
    return client.generic(endpoint.method, path, body, content_type="application/json")


def snapshot() -> tuple[Any, ...]:
    """Everything an endpoint of the matrix could change."""
    return (
        sorted(Queue.objects.values_list("name", "max_retries", "rate_limit", "paused")),
        sorted(Task.objects.values_list("id", "status")),
        TaskEvent.objects.count(),
        sorted(Schedule.objects.values_list("name", "paused")),
    )


def assert_unauthenticated(response: Response) -> None:
    assert_error(response, status.HTTP_401_UNAUTHORIZED, "unauthenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")


MATRIX = [
    pytest.param(endpoint, role, id=f"{endpoint.id} as {role}")
    for endpoint in ENDPOINTS
    for role in ROLES
]


@pytest.mark.parametrize(("endpoint", "role"), MATRIX)
def test_role_matrix__allowed_roles_pass_others_get_forbidden(
    endpoint: Endpoint,
    role: str,
    paths: dict[str, str],
    make_client: Callable[[str | None], APIClient],
) -> None:
    before = snapshot()

    response = send(make_client(role), endpoint, paths)

    if role in endpoint.allowed and endpoint.success is not None:
        assert response.status_code == endpoint.success, response.content
    elif role in endpoint.allowed:
        unwanted = {status.HTTP_401_UNAUTHORIZED, status.HTTP_403_FORBIDDEN}
        assert response.status_code not in unwanted, response.content
        assert response.status_code < status.HTTP_500_INTERNAL_SERVER_ERROR, response.content
    else:
        assert_error(response, status.HTTP_403_FORBIDDEN, "forbidden")
        assert snapshot() == before


def test_role_matrix__covers_every_route() -> None:
    """A new endpoint fails here until it has its row in ENDPOINTS."""
    placeholder = re.compile(r"<[^>]+>|\{[^}]+\}")
    in_table = {(e.method, placeholder.sub("*", e.path)) for e in ENDPOINTS}
    routes = set()
    for pattern in urls.urlpatterns:
        if not isinstance(pattern, URLPattern) or pattern.name in PUBLIC_ROUTE_NAMES:
            continue  # URLResolver: the admin site, with its own staff login
        view_class = getattr(pattern.callback, "view_class", None)
        assert view_class is not None, f"{pattern.name}: not a class-based (DRF) view"
        route = "/" + placeholder.sub("*", str(pattern.pattern))
        methods = [
            m for m in ("GET", "POST", "PUT", "PATCH", "DELETE") if hasattr(view_class, m.lower())
        ]
        routes |= {(method, route) for method in methods}

    assert routes - in_table == set()
    assert in_table - routes == set()


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e.id for e in ENDPOINTS])
def test_role_matrix__no_key_is_unauthenticated(endpoint: Endpoint, paths: dict[str, str]) -> None:
    before = snapshot()

    response = send(APIClient(), endpoint, paths)

    assert_unauthenticated(response)
    assert snapshot() == before


def _revoked_key() -> str:
    api_key, key = ApiKey.issue(name="gone", role=ADMIN)
    api_key.revoked = True
    api_key.save(update_fields=["revoked"])
    return f"Bearer {key}"


def _key_of_role(role: str) -> Callable[[], str]:
    def make() -> str:
        _, key = ApiKey.issue(name=f"raw-{role}", role=role)
        return key

    return make


BAD_HEADERS: dict[str, Callable[[], str]] = {
    "unknown key": lambda: "Bearer tf_not-a-key-anyone-issued",
    "revoked key": _revoked_key,
    "basic scheme": lambda: "Basic YWRtaW46YWRtaW4=",
    "basic scheme with a real key": lambda: "Basic " + _key_of_role(ADMIN)(),
    "bearer without key": lambda: "Bearer",
    "bearer with blank key": lambda: "Bearer    ",
    "key without scheme": _key_of_role(ADMIN),
    "empty scheme": lambda: " " + _key_of_role(ADMIN)(),
}


# Authentication runs before any view code, the same for every endpoint: a
# read, a write of each app and a worker call stand for all of them.
AUTH_SAMPLE = [
    e
    for e in ENDPOINTS
    if e.id
    in {
        "GET /queues",
        "POST /queues/{queue}/tasks",
        "DELETE /queues/{queue}/tasks/{task}",
        "POST /queues/{queue}/dlq/replay",
        "POST /workers/claim",
    }
]
assert len(AUTH_SAMPLE) == 5, "an AUTH_SAMPLE id no longer names a row of ENDPOINTS"


@pytest.mark.parametrize("endpoint", AUTH_SAMPLE, ids=[e.id for e in AUTH_SAMPLE])
@pytest.mark.parametrize("header", list(BAD_HEADERS), ids=list(BAD_HEADERS))
def test_role_matrix__bad_credentials_are_unauthenticated(
    endpoint: Endpoint, header: str, paths: dict[str, str]
) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=BAD_HEADERS[header]())
    before = snapshot()

    response = send(client, endpoint, paths)

    assert_unauthenticated(response)
    assert snapshot() == before


@pytest.mark.parametrize("path", PUBLIC_PATHS)
def test_public_endpoints__need_no_key(path: str) -> None:
    response = APIClient().get(path)

    assert response.status_code == status.HTTP_200_OK, response.content


def test_authentication__scheme_is_case_insensitive(paths: dict[str, str]) -> None:
    """RFC 9110: the auth scheme is case-insensitive."""
    _, key = ApiKey.issue(name="lower", role=WORKER)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"bearer {key}")

    response = client.get("/queues")

    assert response.status_code == status.HTTP_200_OK


def test_authentication__sets_last_used_at(paths: dict[str, str]) -> None:
    api_key, key = ApiKey.issue(name="usage", role=PRODUCER)
    assert api_key.last_used_at is None
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")

    response = client.get("/queues")

    assert response.status_code == status.HTTP_200_OK
    api_key.refresh_from_db()
    assert api_key.last_used_at is not None


def test_authentication__revoked_key_use_does_not_touch_last_used_at() -> None:
    api_key, key = ApiKey.issue(name="revoked", role=ADMIN)
    ApiKey.objects.filter(pk=api_key.pk).update(revoked=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")

    response = client.get("/queues")

    assert_unauthenticated(response)
    api_key.refresh_from_db()
    assert api_key.last_used_at is None


# createapikey ---------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_createapikey__prints_only_the_key_and_stores_its_hash(role: str) -> None:
    out, err = StringIO(), StringIO()

    call_command("createapikey", "ci-runner", "--role", role, stdout=out, stderr=err)

    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    key = lines[0]
    assert key == key.strip()
    assert key
    assert err.getvalue() == ""
    row = ApiKey.objects.get()
    assert row.name == "ci-runner"
    assert row.role == role
    assert row.key_hash != key
    assert row.key_hash == hashlib.sha256(key.encode()).hexdigest()
    # The key itself is in no column of the row.
    stored = [str(value) for value in ApiKey.objects.values().get().values()]
    assert not any(key in value for value in stored)


def test_createapikey__printed_key_authenticates_with_its_role() -> None:
    QueueFactory(name="cli-q")
    out = StringIO()
    call_command("createapikey", "cli", role=PRODUCER, stdout=out)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {out.getvalue().strip()}")

    assert client.get("/queues/cli-q/stats").status_code == status.HTTP_200_OK
    assert_error(client.delete("/queues/cli-q"), status.HTTP_403_FORBIDDEN, "forbidden")


def test_createapikey__each_call_prints_a_new_key() -> None:
    first, second = StringIO(), StringIO()

    call_command("createapikey", "a", role=WORKER, stdout=first)
    call_command("createapikey", "a", role=WORKER, stdout=second)

    assert first.getvalue() != second.getvalue()
    assert ApiKey.objects.count() == 2


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["x", "--role", "bogus"], id="unknown role"),
        pytest.param(["x", "--role", "Admin"], id="role is case-sensitive"),
        pytest.param(["x"], id="no role"),
    ],
)
def test_createapikey__refuses_bad_arguments(args: list[str]) -> None:
    out = StringIO()

    with pytest.raises(CommandError):
        call_command("createapikey", *args, stdout=out)

    assert out.getvalue() == ""
    assert ApiKey.objects.count() == 0


# createqueue ----------------------------------------------------------------


def test_createqueue__prints_the_queue_as_json() -> None:
    out = StringIO()

    call_command(
        "createqueue",
        "emails",
        "--max-retries",
        "5",
        "--rate-limit",
        "20",
        "--max-concurrency",
        "7",
        stdout=out,
    )

    printed = json.loads(out.getvalue())
    queue = Queue.objects.get(name="emails")
    assert printed == {
        "id": str(queue.id),
        "name": "emails",
        "max_retries": 5,
        "rate_limit": 20,
        "max_concurrency": 7,
        "push": None,
        "paused": False,
        "retry_policy": None,
        "key_weights": {},
        "key_max_concurrency": None,
        "key_rate_limit": None,
        "created_at": printed["created_at"],
    }
    assert printed["created_at"].endswith("Z")


def test_createqueue__defaults() -> None:
    out = StringIO()

    call_command("createqueue", "plain", stdout=out)

    printed = json.loads(out.getvalue())
    assert (
        printed["max_retries"],
        printed["rate_limit"],
        printed["max_concurrency"],
        printed["paused"],
    ) == (3, None, None, False)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["taken"], id="duplicate name"),
        pytest.param(["-leading-dash"], id="name starts with dash"),
        pytest.param(["has space"], id="space in name"),
        pytest.param(["x" * 101], id="name too long"),
        pytest.param(["ok-name", "--max-retries", "101"], id="max retries too high"),
        pytest.param(["ok-name", "--max-retries", "-1"], id="max retries negative"),
        pytest.param(["ok-name", "--rate-limit", "0"], id="rate limit zero"),
        pytest.param(["ok-name", "--max-concurrency", "0"], id="cap zero"),
        pytest.param(["ok-name", "--max-concurrency", "100001"], id="cap too high"),
    ],
)
def test_createqueue__refuses_bad_arguments(args: list[str]) -> None:
    QueueFactory(name="taken")
    out = StringIO()

    with pytest.raises(CommandError):
        call_command("createqueue", *args, stdout=out)

    assert out.getvalue() == ""
    assert list(Queue.objects.values_list("name", flat=True)) == ["taken"]
