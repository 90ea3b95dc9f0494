"""The audit log keeps push settings redacted (API.md v1.2 "Secrets in push settings"): a
`push` change records the URL without user info and query and the header names, never a
value; entries are never deleted, so the migration redacts those written before."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from queues import services
from queues.tests.factories import QueueFactory
from taskforge.audit.log import CLI
from taskforge.audit.models import AuditEntry

CLEAR = {
    "url": "https://bot:pa55word@hooks.example.com/in?token=qt0ken",
    "timeout_seconds": 30,
    "headers": {"Authorization": "Bearer s3cret"},
}
SHOWN = {
    "url": "https://hooks.example.com/in",
    "timeout_seconds": 30,
    "headers": {"Authorization": "[redacted]"},
}
OTHER_CLEAR = {"url": "http://other.example/?k=v4lue", "timeout_seconds": 5, "headers": {}}
OTHER_SHOWN = {"url": "http://other.example/", "timeout_seconds": 5, "headers": {}}


@pytest.mark.django_db
def test_create_and_update__record_push_redacted_old_and_new() -> None:
    queue = services.create_queue("hooks", actor=CLI, push=CLEAR, max_retries=2)
    services.update_queue(queue, actor=CLI, push=OTHER_CLEAR, max_retries=4)
    services.update_queue(queue, actor=CLI, push=None)

    assert [(e.action, e.details) for e in AuditEntry.objects.order_by("id")] == [
        ("queue.create", {"push": SHOWN, "max_retries": 2}),
        ("queue.update", {"changed": {"push": [SHOWN, OTHER_SHOWN], "max_retries": [2, 4]}}),
        ("queue.update", {"changed": {"push": [OTHER_SHOWN, None]}}),
    ]


@pytest.mark.django_db
def test_update__a_changed_header_value_alone_is_recorded_without_the_values() -> None:
    queue = QueueFactory(name="hooks", push=CLEAR)
    rotated = {**CLEAR, "headers": {"Authorization": "Bearer n3w"}}
    services.update_queue(queue, actor=CLI, push=rotated)
    services.update_queue(queue, actor=CLI, push=rotated)  # no change: no entry

    [entry] = AuditEntry.objects.all()
    assert entry.details == {"changed": {"push": [SHOWN, SHOWN]}}


@pytest.mark.django_db
def test_createqueue__records_the_push_redacted() -> None:
    call_command(
        "createqueue",
        "hooks",
        "--push-url",
        CLEAR["url"],
        "--push-header",
        "Authorization: Bearer s3cret",
        stdout=io.StringIO(),
    )
    [entry] = AuditEntry.objects.all()
    assert entry.details["push"] == SHOWN


def _entry(action: str, details: dict[str, Any]) -> int:
    return AuditEntry.objects.create(
        actor_kind="cli", actor_name="manage.py", action=action, queue="hooks", details=details
    ).pk


@pytest.mark.django_db(transaction=True)
def test_migration__redacts_the_push_settings_entries_hold_and_nothing_else() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([("queues", "0003_push")])
    try:
        ids = {
            "create": _entry("queue.create", {"push": CLEAR, "max_retries": 2}),
            "create_pulled": _entry("queue.create", {"push": None}),
            "update": _entry(
                "queue.update", {"changed": {"push": [CLEAR, OTHER_CLEAR], "max_retries": [1, 2]}}
            ),
            "update_other": _entry("queue.update", {"changed": {"rate_limit": [None, 5]}}),
            "done_already": _entry("queue.update", {"changed": {"push": [None, SHOWN]}}),
            "purge": _entry("queue.purge", {"cancelled": 3}),
        }
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())

    details = {name: AuditEntry.objects.get(pk=pk).details for name, pk in ids.items()}
    assert details == {
        "create": {"push": SHOWN, "max_retries": 2},
        "create_pulled": {"push": None},
        "update": {"changed": {"push": [SHOWN, OTHER_SHOWN], "max_retries": [1, 2]}},
        "update_other": {"changed": {"rate_limit": [None, 5]}},
        "done_already": {"changed": {"push": [None, SHOWN]}},
        "purge": {"cancelled": 3},
    }
    stored = str(list(AuditEntry.objects.values_list("details", flat=True)))
    for secret in ("pa55word", "qt0ken", "s3cret", "v4lue"):
        assert secret not in stored
