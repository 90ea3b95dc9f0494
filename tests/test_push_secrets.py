"""Secrets in push settings (API.md v1.2 "Security"), through `run_api`: a queue's header
values and its URL's user info and query reach admin keys only; producer and worker keys,
the audit log's details and the server's log lines see them redacted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.test import Client

from taskforge.api.models import ApiKey
from tests.service import API, Api, Service, database_url

pytestmark = pytest.mark.postgres

SECRETS = ("pa55word", "qt0ken", "s3cret", "k3y-value", "r0tated")
PUSH: dict[str, Any] = {
    "url": "https://bot:pa55word@hooks.example.com:8443/in?token=qt0ken",
    "timeout_seconds": 30,
    "headers": {"Authorization": "Bearer s3cret", "X-Api-Key": "k3y-value"},
}
SHOWN: dict[str, Any] = {
    "url": "https://hooks.example.com:8443/in",
    "timeout_seconds": 30,
    "headers": {"Authorization": "[redacted]", "X-Api-Key": "[redacted]"},
}


@pytest.fixture
def server(tmp_path: Path, transactional_db: None, redis_client: redis.Redis) -> Iterator[Service]:
    svc = Service(
        tmp_path,
        {
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "push-secrets-key",
        },
    )
    svc.spawn(API)
    try:
        svc.wait_ready([API])
        yield svc
    finally:
        svc.stop()


def keys(base_url: str) -> dict[str, Api]:
    return {
        role: Api(base_url, ApiKey.issue(name=f"secrets-{role}", role=role)[1])
        for role in ("admin", "producer", "worker")
    }


def test_run_api__only_admin_keys_see_the_secrets_and_the_audit_never_holds_them(
    server: Service,
) -> None:
    api = keys(server.base_url)
    assert api["admin"].ok("POST", "/queues", {"name": "hooks", "push": PUSH})["push"] == PUSH
    # A change of one header value, then of the URL's query.
    rotated = {**PUSH, "headers": {**PUSH["headers"], "X-Api-Key": "r0tated"}}
    assert api["admin"].ok("PATCH", "/queues/hooks", {"push": rotated})["push"] == rotated
    moved = {**rotated, "url": "https://hooks.example.com:8443/v2?token=r0tated"}
    api["admin"].ok("PATCH", "/queues/hooks", {"push": moved})

    assert api["admin"].ok("GET", "/queues/hooks")["push"] == moved
    assert api["admin"].ok("GET", "/queues")["results"][0]["push"] == moved
    shown = {**SHOWN, "url": "https://hooks.example.com:8443/v2"}
    for role in ("producer", "worker"):
        assert api[role].ok("GET", "/queues/hooks")["push"] == shown, role
        assert api[role].ok("GET", "/queues")["results"][0]["push"] == shown, role

    audit = api["admin"].ok("GET", "/audit?queue=hooks")["results"]
    assert [(e["action"], e["details"]) for e in audit] == [
        ("queue.update", {"changed": {"push": [SHOWN, shown]}}),
        # A header value alone changed: the change is recorded, its values are not.
        ("queue.update", {"changed": {"push": [SHOWN, SHOWN]}}),
        ("queue.create", {"push": SHOWN}),
    ]

    log = server.log_text(API)
    assert "/queues/hooks" in log  # the request lines are there
    for secret in SECRETS:
        assert secret not in log, secret


def test_schema__says_what_other_keys_see_of_push(db: None) -> None:
    spec: dict[str, Any] = Client().get("/api/schema/?format=json").json()
    push = spec["components"]["schemas"]["Queue"]["properties"]["push"]
    assert "[redacted]" in push["description"]
    assert "admin keys" in push["description"]
