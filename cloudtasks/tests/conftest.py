"""A real run_api (tests/service.py) for the Cloud Tasks clients to talk to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

from taskforge.api.models import ApiKey
from tests.service import Service, api_process, database_url


@pytest.fixture
def server(tmp_path: Path, transactional_db: None, redis_client: redis.Redis) -> Iterator[Service]:
    with api_process(tmp_path, {"SECRET_KEY": "cloudtasks-secret-key"}) as svc:
        yield svc


@pytest.fixture
def keys(transactional_db: None) -> dict[str, str]:
    """A key per role."""
    return {
        role: ApiKey.issue(name=f"ct-{role}", role=role)[1]
        for role in ("admin", "producer", "worker")
    }


@pytest.fixture
def fleet(tmp_path: Path, transactional_db: None, redis_client: redis.Redis) -> Iterator[Service]:
    svc = Service(
        tmp_path,
        {
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "cloudtasks-delivery",
            "TASKFORGE_PUSH_SIGNING_SECRET": "sign-me",
            # The target is on this host (API.md "Security (v1.2)").
            "TASKFORGE_PUSH_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
        },
        extra_loops=("pusher",),
    )
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()
