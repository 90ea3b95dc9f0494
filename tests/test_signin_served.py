"""Sign-in throttling through `run_api` (API.md "Security (v1.2)", People): the admin's
login form as a browser posts it, and the API beside it, from the same address.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import User
from django.db import connection

from taskforge.api.models import ApiKey
from tests.service import API, Api, Browser, Service, database_url

pytestmark = pytest.mark.postgres

PASSWORD = "correct horse battery staple"


@pytest.fixture
def server(tmp_path: Path, transactional_db: None, redis_client: redis.Redis) -> Iterator[Service]:
    svc = Service(
        tmp_path,
        {
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "signin-secret-key",
        },
    )
    svc.spawn(API)
    try:
        svc.wait_ready([API])
        yield svc
    finally:
        svc.stop()


def test_signin__locked_after_five_failures_and_the_api_unaffected(server: Service) -> None:
    # A cheap hash: the server checks each wrong password against it.
    hashed = PBKDF2PasswordHasher().encode(PASSWORD, "signinsalt", iterations=1000)
    User.objects.create(username="alice", password=hashed, is_staff=True)
    _, key = ApiKey.issue(name="signin-admin", role="admin")

    answers = [Browser(server.base_url).sign_in("alice", f"wrong-{n}")[0] for n in range(5)]
    assert answers == [200, 200, 200, 200, 429]
    status, page = Browser(server.base_url).sign_in("alice", PASSWORD)

    assert status == 429
    assert "sign-in is locked for 15 minutes" in page
    assert 'id="login-form"' in page
    # The API from the same address: keys are no sign-in, and errors stay JSON.
    assert Api(server.base_url, key).call("GET", "/queues")[0] == 200
    status, body = Api(server.base_url, "no-such-key").call("GET", "/queues")
    assert (status, body["error"]["code"]) == (401, "unauthenticated")
    refused = [line for line in server.log_lines(API) if line.get("event") == "signin.refused"]
    assert [(line["username"], line["remote_addr"]) for line in refused] == [
        ("alice", "127.0.0.1"),
        ("alice", "127.0.0.1"),
    ]
