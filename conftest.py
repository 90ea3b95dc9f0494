"""Shared fixtures: API clients per role, a clean Redis db, staff login.

Tests run against the real Postgres and Redis named by DATABASE_URL and
REDIS_URL (`make test` starts throwaway ones when those are unset).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator

import pytest
import redis
from django.conf import settings
from rest_framework.test import APIClient

from queues import lookup
from taskforge.api.authentication import forget_cached_keys
from taskforge.api.health import forget_readiness
from taskforge.api.lane import LaneClientHandler
from taskforge.api.models import ApiKey
from tasks.buffer import forget_seen_sizes

os.environ.setdefault("SECRET_KEY", "test-secret-key")


@pytest.fixture(autouse=True, scope="session")
def _flush_outlasts_live_services() -> Iterator[None]:
    """Transactional tests empty the database with one TRUNCATE after each test.

    Tests that run the service as processes (the SDK's, module-scoped) leave its
    loops running meanwhile; a loop's write that takes its table locks in the
    other order makes Postgres abort one side as a deadlock, sometimes the
    TRUNCATE.  The flush then tries again (it is one transaction).
    """
    from django.db import OperationalError, connection

    ops = connection.ops
    flush = ops.execute_sql_flush

    def execute_sql_flush(sql_list: Iterable[str]) -> None:
        for attempt in range(5):
            try:
                return flush(sql_list)
            except OperationalError as exc:
                if "deadlock detected" not in str(exc) or attempt == 4:
                    raise
        return None

    ops.execute_sql_flush = execute_sql_flush  # type: ignore[method-assign]
    yield
    ops.execute_sql_flush = flush  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    """Each test sees keys, queues and buffers as the databases have them (no per-process
    memory)."""
    forget_cached_keys()
    lookup.clear()
    forget_readiness()
    forget_seen_sizes()
    yield
    forget_cached_keys()
    lookup.clear()
    forget_readiness()
    forget_seen_sizes()


@pytest.fixture
def make_client(db: None) -> Callable[[str | None], APIClient]:
    """`make_client("producer")`: an APIClient holding a fresh key of that role.

    Its calls go through the hot lane as the servers' do (taskforge.api.lane).
    """

    def make(role: str | None) -> APIClient:
        client = APIClient()
        client.handler = LaneClientHandler(enforce_csrf_checks=False)
        if role is not None:
            _, key = ApiKey.issue(name=f"test-{role}", role=role)
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
        return client

    return make


@pytest.fixture
def admin_client(make_client: Callable[[str | None], APIClient]) -> APIClient:
    return make_client("admin")


@pytest.fixture
def producer_client(make_client: Callable[[str | None], APIClient]) -> APIClient:
    return make_client("producer")


@pytest.fixture
def worker_client(make_client: Callable[[str | None], APIClient]) -> APIClient:
    return make_client("worker")


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    """The Redis db of REDIS_URL, flushed before and after the test."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()
