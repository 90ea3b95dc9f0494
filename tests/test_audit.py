"""The audit log (API.md v1.1): each operator action writes one entry, with who did it,
in the action's own transaction; through the API, the dashboard, Django admin and manage.py."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import transaction
from django.test import Client
from django.utils import timezone
from rest_framework import status
from rest_framework.test import APIClient

from dlq import services as dlq_services
from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.api.models import ApiKey
from taskforge.audit.log import CLI, Actor, record
from taskforge.audit.models import Action, AuditEntry
from tasks import retention
from tasks.models import Task, TaskStatus
from tasks.tests.factories import TaskFactory

S = TaskStatus
ADMIN_KEY = {"kind": "api_key", "name": "test-admin"}


def entries() -> list[dict[str, Any]]:
    """Every entry, oldest first, as API.md spells one (without `id` and `at`)."""
    return [
        {
            "actor": {"kind": e.actor_kind, "name": e.actor_name},
            "action": e.action,
            "queue": e.queue,
            "target": e.target,
            "details": e.details,
        }
        for e in AuditEntry.objects.order_by("id")
    ]


def entry(action: str, queue: str | None, target: str | None, actor: Any = None, **details: Any):
    return {
        "actor": actor or ADMIN_KEY,
        "action": action,
        "queue": queue,
        "target": target,
        "details": details,
    }


# Through the API: the key's name ----------------------------------------------------


@pytest.mark.django_db
def test_api__queue_create_pause_resume_purge_delete_are_recorded(
    admin_client: APIClient, redis_client: Any
) -> None:
    assert (
        admin_client.post("/queues", {"name": "q", "max_retries": 5}, format="json").status_code
        == 201
    )
    admin_client.post("/queues/q/pause")
    admin_client.post("/queues/q/pause")  # an explicit pause is recorded even when paused
    admin_client.post("/queues/q/resume")
    TaskFactory.create_batch(3, queue=Queue.objects.get(name="q"))
    assert admin_client.post("/queues/q/purge").json() == {"cancelled": 3}
    assert admin_client.delete("/queues/q").status_code == status.HTTP_204_NO_CONTENT

    assert entries() == [
        entry("queue.create", "q", "q", max_retries=5),
        entry("queue.pause", "q", "q"),
        entry("queue.pause", "q", "q"),
        entry("queue.resume", "q", "q"),
        entry("queue.purge", "q", "q", cancelled=3),  # one entry, none per task
        entry("queue.delete", "q", "q"),
    ]


@pytest.mark.django_db
def test_api__schedule_create_update_delete_are_recorded(admin_client: APIClient) -> None:
    QueueFactory(name="q")
    body = {"name": "nightly", "cron": "0 3 * * *", "payload": {"report": True}}
    assert admin_client.post("/queues/q/schedules", body, format="json").status_code == 201
    changed = {"cron": "0 4 * * *", "paused": True}
    assert (
        admin_client.patch("/queues/q/schedules/nightly", changed, format="json").status_code == 200
    )
    admin_client.patch("/queues/q/schedules/nightly", changed, format="json")  # no change
    assert admin_client.delete("/queues/q/schedules/nightly").status_code == 204

    assert entries() == [
        entry("schedule.create", "q", "nightly", cron="0 3 * * *", timezone="UTC", paused=False),
        entry(
            "schedule.update",
            "q",
            "nightly",
            changed={"cron": ["0 3 * * *", "0 4 * * *"], "paused": [False, True]},
        ),
        entry("schedule.delete", "q", "nightly"),
    ]


@pytest.mark.django_db
def test_api__patch_records_pause_and_the_other_changed_fields(admin_client: APIClient) -> None:
    QueueFactory(name="q", max_retries=3, rate_limit=None)

    admin_client.patch(
        "/queues/q", {"paused": True, "max_retries": 5, "rate_limit": None}, format="json"
    )
    admin_client.patch("/queues/q", {"max_retries": 5, "paused": True}, format="json")
    admin_client.patch("/queues/q", {"max_concurrency": 10}, format="json")
    admin_client.patch("/queues/q", {"max_concurrency": None}, format="json")

    assert entries() == [
        entry("queue.pause", "q", "q"),
        entry("queue.update", "q", "q", changed={"max_retries": [3, 5]}),
        # The second PATCH changed nothing: no entry.
        entry("queue.update", "q", "q", changed={"max_concurrency": [None, 10]}),
        entry("queue.update", "q", "q", changed={"max_concurrency": [10, None]}),
    ]


@pytest.mark.django_db
def test_api__cancel_names_the_producer_key_and_the_task(producer_client: APIClient) -> None:
    task = TaskFactory(queue=QueueFactory(name="q"))

    assert producer_client.delete(f"/queues/q/tasks/{task.pk}").status_code == 200

    producer = {"kind": "api_key", "name": "test-producer"}
    assert entries() == [entry("task.cancel", "q", str(task.pk), producer)]


@pytest.mark.django_db
def test_api__a_refused_action_writes_no_entry(admin_client: APIClient) -> None:
    queue = QueueFactory(name="q")
    running = TaskFactory(queue=queue, status=S.EXECUTING)

    assert admin_client.delete(f"/queues/q/tasks/{running.pk}").status_code == 409
    assert admin_client.delete("/queues/q").status_code == 409  # a live task remains
    assert admin_client.post("/queues/q/dlq/" + str(running.pk) + "/replay").status_code == 404
    assert admin_client.post("/queues", {"name": "q"}, format="json").status_code == 409

    assert entries() == []


@pytest.mark.django_db
def test_api__dlq_replay_one_bulk_all_and_discard(admin_client: APIClient) -> None:
    queue = QueueFactory(name="q")
    one, two, three, four, five = TaskFactory.create_batch(5, queue=queue, status=S.DEAD)

    admin_client.post(f"/queues/q/dlq/{one.pk}/replay")
    admin_client.post(
        "/queues/q/dlq/replay", {"ids": [str(two.pk), str(one.pk)]}, format="json"
    )  # one is not dead any more: skipped
    admin_client.delete(f"/queues/q/dlq/{three.pk}")
    admin_client.post("/queues/q/dlq/replay", {"all": True}, format="json")
    admin_client.post("/queues/q/dlq/replay", {"all": True}, format="json")  # nothing dead

    assert entries() == [
        entry("dlq.replay", "q", str(one.pk)),
        entry("dlq.replay", "q", None, count=1),
        entry("dlq.discard", "q", str(three.pk)),
        entry("dlq.replay", "q", None, count=2),
        entry("dlq.replay", "q", None, count=0),
    ]
    assert {four.pk, five.pk} <= set(
        Task.objects.filter(status=S.PENDING).values_list("pk", flat=True)
    )


# manage.py: the CLI actor ---------------------------------------------------------------


@pytest.mark.django_db
def test_cli__createqueue_and_createapikey_are_recorded_as_manage_py() -> None:
    call_command("createqueue", "q", "--max-retries", "2", stdout=io.StringIO())
    call_command("createapikey", "ci", "--role", "producer", stdout=io.StringIO())

    cli = {"kind": "cli", "name": "manage.py"}
    key = ApiKey.objects.get(name="ci")
    assert entries() == [
        entry("queue.create", "q", "q", cli, max_retries=2, paused=False),
        entry("apikey.create", None, "ci", cli, id=key.pk, role="producer"),
    ]


@pytest.mark.django_db
def test_cli__revokeapikey_is_recorded_once_as_manage_py() -> None:
    key, _ = ApiKey.issue(name="leaving", role="worker")

    call_command("revokeapikey", "leaving", stdout=io.StringIO())
    call_command("revokeapikey", "leaving", stdout=io.StringIO())  # already revoked: no entry

    cli = {"kind": "cli", "name": "manage.py"}
    assert entries() == [entry("apikey.revoke", None, "leaving", cli, id=key.pk, role="worker")]
    assert ApiKey.objects.get(pk=key.pk).revoked


# The dashboard and Django admin: the user's name ----------------------------------------


@pytest.fixture
def root() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    return client


@pytest.mark.django_db
def test_dashboard__actions_name_the_signed_in_user(root: Client) -> None:
    queue = QueueFactory(name="q")
    pending = TaskFactory(queue=queue)
    dead, other = TaskFactory.create_batch(2, queue=queue, status=S.DEAD)
    d = "/admin/dashboard"

    root.post(f"{d}/queues/q/pause")
    root.post(f"{d}/tasks/{pending.pk}/cancel")
    root.post(f"{d}/dlq/{dead.pk}/replay")
    root.post(f"{d}/dlq/discard", {"ids": [str(other.pk)]})
    root.post(f"{d}/queues/q/purge", {"confirm": "q"})

    user = {"kind": "user", "name": "root"}
    assert entries() == [
        entry("queue.pause", "q", "q", user),
        entry("task.cancel", "q", str(pending.pk), user),
        entry("dlq.replay", "q", str(dead.pk), user),
        entry("dlq.discard", "q", str(other.pk), user),
        entry("queue.purge", "q", "q", user, cancelled=1),  # dead was replayed: pending again
    ]


@pytest.mark.django_db
def test_admin__queue_key_and_task_actions_name_the_user(root: Client) -> None:
    queue = QueueFactory(name="q")
    first, second = TaskFactory.create_batch(2, queue=queue)
    key, _ = ApiKey.issue(name="old", role="worker")
    a = "/admin"

    root.post(f"{a}/queues/queue/", {"action": "pause", "_selected_action": [str(queue.pk)]})
    root.post(
        f"{a}/tasks/task/",
        {"action": "cancel", "_selected_action": [str(first.pk), str(second.pk)]},
    )
    root.post(f"{a}/api/apikey/", {"action": "revoke", "_selected_action": [str(key.pk)]})
    root.post(f"{a}/api/apikey/", {"action": "revoke", "_selected_action": [str(key.pk)]})
    root.post(f"{a}/api/apikey/add/", {"name": "new", "role": "producer"})

    user = {"kind": "user", "name": "root"}
    new = ApiKey.objects.get(name="new")
    cancelled = sorted([str(first.pk), str(second.pk)])
    assert entries() == [
        entry("queue.pause", "q", "q", user),
        entry("task.cancel", "q", cancelled[0], user),
        entry("task.cancel", "q", cancelled[1], user),
        entry("apikey.revoke", None, "old", user, id=key.pk, role="worker"),
        # The second revoke found it revoked already: no entry.
        entry("apikey.create", None, "new", user, id=new.pk, role="producer"),
    ]


# The entry and its transaction ---------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_record__refuses_to_write_outside_a_transaction() -> None:
    with pytest.raises(RuntimeError):
        record(CLI, Action.QUEUE_PAUSE, queue="q", target="q")
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_record__rolls_back_with_the_action() -> None:
    queue = QueueFactory(name="q")
    dead = TaskFactory(queue=queue, status=S.DEAD)

    with pytest.raises(ZeroDivisionError), transaction.atomic():
        dlq_services.discard(queue, str(dead.pk), actor=Actor.user("root"))
        1 / 0  # noqa: B018  (the action fails after the entry was written)

    assert not AuditEntry.objects.exists()
    assert Task.objects.filter(pk=dead.pk).exists()


@pytest.mark.django_db
def test_retention__never_deletes_audit_entries(admin_client: APIClient) -> None:
    queue = QueueFactory(name="q")
    task = TaskFactory(queue=queue)
    admin_client.delete(f"/queues/q/tasks/{task.pk}")
    AuditEntry.objects.update(at=timezone.now() - timedelta(days=3650))

    retention.delete_expired(now=timezone.now() + timedelta(days=3650))

    assert not Task.objects.filter(pk=task.pk).exists()
    assert entries() == [entry("task.cancel", "q", str(task.pk))]


# GET /audit ------------------------------------------------------------------------


def _entry_at(at: Any, action: Action, actor: Actor, queue: str | None) -> AuditEntry:
    with transaction.atomic():
        entry = record(actor, action, queue=queue, target=queue)
    AuditEntry.objects.filter(pk=entry.pk).update(at=at)
    return entry


@pytest.fixture
def log() -> dict[str, AuditEntry]:
    """Four entries a minute apart, oldest first."""
    t0 = timezone.now() - timedelta(hours=1)
    return {
        "create": _entry_at(t0, Action.QUEUE_CREATE, CLI, "a"),
        "pause": _entry_at(t0 + timedelta(minutes=1), Action.QUEUE_PAUSE, Actor.user("ann"), "a"),
        "key": _entry_at(t0 + timedelta(minutes=2), Action.APIKEY_CREATE, Actor.user("ann"), None),
        "gone": _entry_at(
            t0 + timedelta(minutes=3), Action.QUEUE_DELETE, Actor.api_key("ops"), "b"
        ),
    }


@pytest.mark.django_db
def test_get_audit__lists_entries_newest_first_in_the_contract_shape(
    admin_client: APIClient, log: dict[str, AuditEntry]
) -> None:
    response = admin_client.get("/audit")

    assert response.status_code == status.HTTP_200_OK
    body = response.json()
    assert body["next"] is None
    assert [e["id"] for e in body["results"]] == [
        log[k].pk for k in ("gone", "key", "pause", "create")
    ]
    gone = AuditEntry.objects.get(pk=log["gone"].pk)
    assert body["results"][0] == {
        "id": gone.pk,
        "at": gone.at.isoformat().replace("+00:00", "Z"),
        "actor": {"kind": "api_key", "name": "ops"},
        "action": "queue.delete",
        "queue": "b",
        "target": "b",
        "details": {},
    }


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("action=queue.pause", ["pause"]),
        ("actor=ann", ["key", "pause"]),
        ("actor=an", []),  # exact names only
        ("actor=manage.py", ["create"]),
        ("queue=a", ["pause", "create"]),
        ("queue=b", ["gone"]),  # a deleted queue's history stays readable
        ("action=apikey.create&actor=ann", ["key"]),
    ],
)
def test_get_audit__filters(
    admin_client: APIClient, log: dict[str, AuditEntry], query: str, expected: list[str]
) -> None:
    response = admin_client.get(f"/audit?{query}")

    assert [e["id"] for e in response.json()["results"]] == [log[k].pk for k in expected]


@pytest.mark.django_db
def test_get_audit__time_filters_are_exclusive(
    admin_client: APIClient, log: dict[str, AuditEntry]
) -> None:
    pause = AuditEntry.objects.get(pk=log["pause"].pk).at
    gone = AuditEntry.objects.get(pk=log["gone"].pk).at
    after = pause.isoformat().replace("+00:00", "Z")
    before = gone.isoformat().replace("+00:00", "Z")

    response = admin_client.get("/audit", {"after": after, "before": before})

    assert [e["id"] for e in response.json()["results"]] == [log["key"].pk]


@pytest.mark.django_db
def test_get_audit__pages_with_a_cursor(
    admin_client: APIClient, log: dict[str, AuditEntry]
) -> None:
    first = admin_client.get("/audit?limit=3").json()
    second = admin_client.get(first["next"]).json()

    ids = [e["id"] for e in first["results"] + second["results"]]
    assert ids == [log[k].pk for k in ("gone", "key", "pause", "create")]
    assert second["next"] is None


@pytest.mark.django_db
def test_get_audit__is_for_admin_keys_only(
    producer_client: APIClient, worker_client: APIClient
) -> None:
    for client in (producer_client, worker_client):
        response = client.get("/audit")
        assert response.status_code == status.HTTP_403_FORBIDDEN
        assert response.json()["error"]["code"] == "forbidden"
    assert APIClient().get("/audit").status_code == status.HTTP_401_UNAUTHORIZED


@pytest.mark.django_db
def test_admin__queue_add_and_change_record_create_and_the_changed_fields(root: Client) -> None:
    form = {"name": "adm", "max_retries": 3, "rate_limit": ""}
    assert root.post("/admin/queues/queue/add/", form).status_code == 302
    queue = Queue.objects.get(name="adm")
    change = {"max_retries": 7, "rate_limit": 20, "paused": "on"}
    assert root.post(f"/admin/queues/queue/{queue.pk}/change/", change).status_code == 302

    user = {"kind": "user", "name": "root"}
    assert entries() == [
        entry("queue.create", "adm", "adm", user),
        entry("queue.pause", "adm", "adm", user),
        entry(
            "queue.update",
            "adm",
            "adm",
            user,
            changed={"max_retries": [3, 7], "rate_limit": [None, 20]},
        ),
    ]


@pytest.mark.django_db(transaction=True)
def test_api__every_action_writes_its_entry_inside_its_own_transaction(redis_client: Any) -> None:
    """Outside a test's wrapping transaction, record() refuses to write unless the
    service opened one: every action below would answer 500 if it had not."""
    _, key = ApiKey.issue(name="ops", role="admin")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.post("/queues", {"name": "t"}, format="json").status_code == 201
    assert client.patch("/queues/t", {"max_retries": 1}, format="json").status_code == 200
    queue = Queue.objects.get(name="t")
    pending = TaskFactory(queue=queue)
    dead, gone = TaskFactory.create_batch(2, queue=queue, status=S.DEAD)
    assert client.post("/queues/t/pause").status_code == 200
    assert client.delete(f"/queues/t/tasks/{pending.pk}").status_code == 200
    assert client.post(f"/queues/t/dlq/{dead.pk}/replay").status_code == 200
    assert client.delete(f"/queues/t/dlq/{gone.pk}").status_code == 204
    assert client.post("/queues/t/dlq/replay", {"all": True}, format="json").status_code == 200
    assert client.post("/queues/t/purge").status_code == 200
    assert client.delete("/queues/t").status_code == 204
    call_command("createapikey", "ci", "--role", "worker", stdout=io.StringIO())

    assert [e["action"] for e in entries()] == [
        "queue.create",
        "queue.update",
        "queue.pause",
        "task.cancel",
        "dlq.replay",
        "dlq.discard",
        "dlq.replay",
        "queue.purge",
        "queue.delete",
        "apikey.create",
    ]
