"""The fairness fields of the API (API.md "Fairness keys (v1.2)"): the enqueue's
`fairness_key`, the queue's `key_weights`, `key_max_concurrency` and `key_rate_limit`,
and their 400s."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import status
from rest_framework.test import APIClient

from queues.models import Queue
from tasks.models import Task

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(admin_client: APIClient) -> dict[str, Any]:
    body: dict[str, Any] = admin_client.post("/queues", {"name": "q"}, format="json").json()
    return body


def _enqueue(client: APIClient, body: dict[str, Any]) -> Any:
    return client.post("/queues/q/tasks", body, format="json")


@pytest.mark.usefixtures("queue", "redis_client")
def test_enqueue__fairness_key_kept_and_shown(producer_client: APIClient) -> None:
    answer = _enqueue(producer_client, {"payload": 1, "fairness_key": "tenant é 42"})
    assert answer.status_code == status.HTTP_201_CREATED
    assert answer.json()["fairness_key"] == "tenant é 42"
    assert Task.objects.get(pk=answer.json()["id"]).fairness_key == "tenant é 42"
    plain = _enqueue(producer_client, {"payload": 1}).json()
    assert plain["fairness_key"] is None
    batch = producer_client.post(
        "/queues/q/tasks/batch",
        {"tasks": [{"payload": 1, "fairness_key": "a"}, {"payload": 2}]},
        format="json",
    ).json()["results"]
    assert [t["fairness_key"] for t in batch] == ["a", None]
    assert _enqueue(producer_client, {"payload": 1, "fairness_key": "x" * 200}).status_code == 201


@pytest.mark.usefixtures("queue", "redis_client")
@pytest.mark.parametrize(
    "key", ["", " a", "a ", "a\tb", "a\x7f", "a\x85b", "x" * 201, 5, None, ["a"], {"a": 1}]
)
def test_enqueue__bad_fairness_key_is_400(producer_client: APIClient, key: Any) -> None:
    answer = _enqueue(producer_client, {"payload": 1, "fairness_key": key})
    assert answer.status_code == status.HTTP_400_BAD_REQUEST, answer.json()
    body = answer.json()
    assert body["error"]["code"] == "invalid"
    assert "fairness_key" in body["error"]["fields"]
    batch = producer_client.post(
        "/queues/q/tasks/batch", {"tasks": [{"payload": 1, "fairness_key": key}]}, format="json"
    )
    assert batch.status_code == status.HTTP_400_BAD_REQUEST


def test_queue__key_settings_create_patch_get(admin_client: APIClient) -> None:
    created = admin_client.post(
        "/queues",
        {
            "name": "q",
            "key_weights": {"A": 3, "B": 1},
            "key_max_concurrency": 2,
            "key_rate_limit": 0.5,
        },
        format="json",
    )
    assert created.status_code == status.HTTP_201_CREATED
    body = created.json()
    assert body["key_weights"] == {"A": 3, "B": 1}  # weights of 1 read back as sent
    assert (body["key_max_concurrency"], body["key_rate_limit"]) == (2, 0.5)
    patched = admin_client.patch("/queues/q", {"key_weights": {"C": 100}}, format="json").json()
    assert patched["key_weights"] == {"C": 100}  # replaced as a whole
    patched = admin_client.patch(
        "/queues/q", {"key_max_concurrency": None, "key_rate_limit": 7}, format="json"
    ).json()
    assert (patched["key_max_concurrency"], patched["key_rate_limit"]) == (None, 7)
    got = admin_client.get("/queues/q").json()
    assert got["key_weights"] == {"C": 100}
    queue = Queue.objects.get(name="q")
    assert (queue.key_weights, queue.key_max_concurrency, queue.key_rate_limit) == (
        {"C": 100},
        None,
        7,
    )


@pytest.mark.parametrize(
    "field,value",
    [
        ("key_weights", None),
        ("key_weights", []),
        ("key_weights", {"A": 0}),
        ("key_weights", {"A": 101}),
        ("key_weights", {"A": 1.5}),
        ("key_weights", {"A": True}),
        ("key_weights", {"A": "3"}),
        ("key_weights", {" A": 3}),
        ("key_weights", {"": 3}),
        ("key_weights", {"a\nb": 3}),
        ("key_weights", {"x" * 201: 3}),
        ("key_weights", {f"k{n}": 2 for n in range(1001)}),
        ("key_max_concurrency", 0),
        ("key_max_concurrency", 100_001),
        ("key_max_concurrency", 1.5),
        ("key_max_concurrency", "2"),
        ("key_rate_limit", 0),
        ("key_rate_limit", -1),
        ("key_rate_limit", "1"),
        ("key_rate_limit", True),
    ],
)
def test_queue__bad_key_settings_are_400(admin_client: APIClient, field: str, value: Any) -> None:
    created = admin_client.post("/queues", {"name": "q", field: value}, format="json")
    assert created.status_code == status.HTTP_400_BAD_REQUEST, created.json()
    assert field in created.json()["error"]["fields"]
    admin_client.post("/queues", {"name": "q"}, format="json")
    patched = admin_client.patch("/queues/q", {field: value}, format="json")
    assert patched.status_code == status.HTTP_400_BAD_REQUEST
    assert field in patched.json()["error"]["fields"]


def test_queue__a_thousand_weights_are_fine(admin_client: APIClient) -> None:
    weights = {f"k{n}": 1 + n % 100 for n in range(1000)}
    created = admin_client.post("/queues", {"name": "q", "key_weights": weights}, format="json")
    assert created.status_code == status.HTTP_201_CREATED
    assert created.json()["key_weights"] == weights


@pytest.mark.usefixtures("queue", "redis_client")
def test_task_list__fairness_key_filter(producer_client: APIClient) -> None:
    for key in ["a", "a", "b", None]:
        body: dict[str, Any] = {"payload": 1}
        if key is not None:
            body["fairness_key"] = key
        _enqueue(producer_client, body)
    listed = producer_client.get("/queues/q/tasks?fairness_key=a").json()["results"]
    assert [t["fairness_key"] for t in listed] == ["a", "a"]
    anonymous = producer_client.get("/queues/q/tasks?fairness_key=").json()["results"]
    assert [t["fairness_key"] for t in anonymous] == [None]
    stats = producer_client.get("/queues/q/stats").json()
    assert stats["keys"] == 3
    keys = producer_client.get("/queues/q/keys").json()
    assert [row["key"] for row in keys["results"]] == [None, "a", "b"]
    assert keys["results"][1] == {
        "key": "a",
        "pending": 2,
        "executing": 0,
        "retry": 0,
        "oldest_pending_age_seconds": keys["results"][1]["oldest_pending_age_seconds"],
    }
    bad = producer_client.get("/queues/q/keys?cursor=WzIsImEiXQ")  # [2,"a"]: not this list's
    assert bad.status_code == status.HTTP_400_BAD_REQUEST


def test_createqueue__key_settings() -> None:
    import json
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    call_command(
        "createqueue",
        "cli",
        "--key-weight",
        "A=3",
        "--key-weight",
        "x=y=2",
        "--key-max-concurrency",
        "4",
        "--key-rate-limit",
        "0.5",
        stdout=out,
    )
    shown = json.loads(out.getvalue())
    assert shown["key_weights"] == {"A": 3, "x=y": 2}
    assert (shown["key_max_concurrency"], shown["key_rate_limit"]) == (4, 0.5)
    with pytest.raises(CommandError, match="key_weights"):
        call_command("createqueue", "cli2", "--key-weight", "A=0")
    with pytest.raises(CommandError, match="key_rate_limit"):
        call_command("createqueue", "cli2", "--key-rate-limit", "0")
