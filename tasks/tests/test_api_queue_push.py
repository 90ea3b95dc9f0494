"""A queue's `push` field over the API (API.md v1.1 "Queue" and "Push delivery")."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from queues.models import Queue

pytestmark = pytest.mark.django_db

URL = "https://hooks.example.com/tasks?x=1"


def test_create__stores_the_target_with_its_defaults(admin_client: APIClient) -> None:
    response = admin_client.post("/queues", {"name": "hooks", "push": {"url": URL}}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["push"] == {"url": URL, "timeout_seconds": 30, "headers": {}}
    assert Queue.objects.get(name="hooks").push == {
        "url": URL,
        "timeout_seconds": 30,
        "headers": {},
    }


def test_create__without_push_is_a_pulled_queue(admin_client: APIClient) -> None:
    response = admin_client.post("/queues", {"name": "pulled"}, format="json")
    assert response.json()["push"] is None


@pytest.mark.parametrize(
    "push",
    [
        "https://a.example",
        [],
        {},
        {"url": ""},
        {"url": 5},
        {"url": "ftp://a.example/x"},
        {"url": "https://"},
        {"url": "a.example/x"},
        {"url": "https://a.example/\r\nX: y"},
        {"url": "https://a.example:99999/"},
        {"url": "https://a.example/x#frag"},
        {"url": "https://a.example/" + "x" * 2048},
        {"url": "https://a.example/a b"},
        {"url": URL, "timeout_seconds": 0},
        {"url": URL, "timeout_seconds": 1801},
        {"url": URL, "timeout_seconds": "30"},
        {"url": URL, "timeout_seconds": 1.5},
        {"url": URL, "timeout_seconds": True},
        {"url": URL, "headers": []},
        {"url": URL, "headers": {"X-N": 1}},
        {"url": URL, "headers": {f"X-{n}": "v" for n in range(21)}},
        {"url": URL, "headers": {"Host": "a"}},
        {"url": URL, "headers": {"content-length": "5"}},
        {"url": URL, "headers": {"Connection": "close"}},
        {"url": URL, "headers": {"Transfer-Encoding": "chunked"}},
        {"url": URL, "headers": {"X-A": "a\r\nX-B: b"}},
        {"url": URL, "headers": {"X-A": "a\nb"}},
        {"url": URL, "headers": {"X A": "a"}},
        {"url": URL, "headers": {"X-A\r\n": "a"}},
        {"url": URL, "headers": {"X-A": "snow ☃"}},
        {"url": URL, "headers": {"X-A": "1", "x-a": "2"}},
        {"url": URL, "headers": {"X-A": "v" * 8193}},
        {"url": URL, "retries": 3},
    ],
)
def test_create__refuses_a_bad_target_with_400(admin_client: APIClient, push: Any) -> None:
    response = admin_client.post("/queues", {"name": "bad", "push": push}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert set(error["fields"]) == {"push"}
    assert all(isinstance(m, str) and m for m in error["fields"]["push"])
    assert not Queue.objects.filter(name="bad").exists()


def test_headers__authorization_and_twenty_are_allowed(admin_client: APIClient) -> None:
    headers = {f"X-{n}": "v" for n in range(19)} | {"Authorization": "Bearer abc"}
    response = admin_client.post(
        "/queues", {"name": "h", "push": {"url": URL, "headers": headers}}, format="json"
    )
    assert response.status_code == 201
    assert response.json()["push"]["headers"] == headers


def test_patch__replaces_push_as_a_whole_and_null_turns_it_off(admin_client: APIClient) -> None:
    first = {"url": URL, "timeout_seconds": 10, "headers": {"X-A": "1"}}
    admin_client.post("/queues", {"name": "q", "push": first}, format="json")
    response = admin_client.patch(
        "/queues/q", {"push": {"url": "http://b.example/"}}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["push"] == {
        "url": "http://b.example/",
        "timeout_seconds": 30,
        "headers": {},
    }
    response = admin_client.patch("/queues/q", {"push": None}, format="json")
    assert response.json()["push"] is None
    assert Queue.objects.get(name="q").push is None


SECRET_URL = "https://bot:pa55word@hooks.example.com:8443/tasks?token=qt0ken"
SECRET_PUSH = {
    "url": SECRET_URL,
    "timeout_seconds": 30,
    "headers": {"Authorization": "Bearer s3cret", "X-Api-Key": "k3y"},
}
REDACTED_PUSH = {
    "url": "https://hooks.example.com:8443/tasks",
    "timeout_seconds": 30,
    "headers": {"Authorization": "[redacted]", "X-Api-Key": "[redacted]"},
}


def test_secrets_are_shown_to_admin_keys_only(
    admin_client: APIClient, producer_client: APIClient, worker_client: APIClient
) -> None:
    """API.md v1.2 "Secrets in push settings": header values, the URL's user info and
    query, to admin keys only; producer and worker keys see them redacted."""
    created = admin_client.post("/queues", {"name": "q", "push": SECRET_PUSH}, format="json")
    assert created.json()["push"] == SECRET_PUSH
    assert admin_client.get("/queues/q").json()["push"] == SECRET_PUSH
    assert admin_client.get("/queues").json()["results"][0]["push"] == SECRET_PUSH
    for client in (producer_client, worker_client):
        assert client.get("/queues/q").json()["push"] == REDACTED_PUSH
        assert client.get("/queues").json()["results"][0]["push"] == REDACTED_PUSH


def test_no_other_answer_to_producer_and_worker_keys_names_a_secret(
    admin_client: APIClient, producer_client: APIClient, worker_client: APIClient
) -> None:
    admin_client.post("/queues", {"name": "q", "push": SECRET_PUSH}, format="json")
    task = producer_client.post("/queues/q/tasks", {"payload": {"n": 1}}, format="json")
    assert task.status_code == 201
    answers = [
        task,
        producer_client.get(f"/queues/q/tasks/{task.json()['id']}"),
        producer_client.get("/queues/q/tasks"),
        producer_client.get("/queues/q/stats"),
        worker_client.post("/workers/claim", {"worker_id": "w", "queues": ["q"]}, format="json"),
    ]
    for answer in answers:
        assert answer.status_code in (200, 201), answer.content
        for secret in ("pa55word", "qt0ken", "s3cret", "k3y"):
            assert secret not in answer.content.decode()


def test_patch__a_bad_target_changes_nothing(admin_client: APIClient) -> None:
    admin_client.post("/queues", {"name": "q", "push": {"url": URL}}, format="json")
    response = admin_client.patch(
        "/queues/q", {"push": {"url": URL, "headers": {"Host": "x"}}}, format="json"
    )
    assert response.status_code == 400
    assert set(response.json()["error"]["fields"]) == {"push"}
    assert (Queue.objects.get(name="q").push or {})["url"] == URL


def test_createqueue__push_options(capsys: pytest.CaptureFixture[str]) -> None:
    call_command(
        "createqueue",
        "hooks",
        "--push-url",
        URL,
        "--push-timeout",
        "10",
        "--push-header",
        "Authorization: Bearer abc",
        "--max-concurrency",
        "5",
    )
    queue = Queue.objects.get(name="hooks")
    assert queue.push == {
        "url": URL,
        "timeout_seconds": 10,
        "headers": {"Authorization": "Bearer abc"},
    }
    assert queue.max_concurrency == 5
    assert '"Bearer abc"' in capsys.readouterr().out
    with pytest.raises(CommandError, match="push"):
        call_command("createqueue", "bad", "--push-url", "ftp://x")
    with pytest.raises(CommandError, match="need --push-url"):
        call_command("createqueue", "bad", "--push-timeout", "5")
