"""Sign-in throttling through `run_api` (API.md "Security (v1.2)", People): the admin's
login form as a browser posts it, and the API beside it, from the same address.
"""

from __future__ import annotations

import http.client
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import User
from django.db import connection

from taskforge.api.models import ApiKey
from tests.service import API, Api, Service, database_url

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


class Browser:
    """The admin's login form, posted the way a browser posts it (CSRF cookie and field)."""

    def __init__(self, service: Service) -> None:
        self.port = service.port
        self.cookies: dict[str, str] = {}

    def request(
        self, method: str, path: str, form: dict[str, str] | None = None
    ) -> tuple[int, str]:
        headers = {"Connection": "close"}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            text = response.read().decode()
            for value in response.headers.get_all("Set-Cookie") or []:
                name, _, rest = value.partition("=")
                self.cookies[name] = rest.split(";", 1)[0]
        finally:
            conn.close()
        return response.status, text

    def sign_in(self, username: str, password: str) -> tuple[int, str]:
        status, page = self.request("GET", "/admin/login/")
        assert status == 200
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert match
        form = {"csrfmiddlewaretoken": match[1], "username": username, "password": password}
        return self.request("POST", "/admin/login/?next=/admin/", {**form, "next": "/admin/"})


def test_signin__locked_after_five_failures_and_the_api_unaffected(server: Service) -> None:
    # A cheap hash: the server checks each wrong password against it.
    hashed = PBKDF2PasswordHasher().encode(PASSWORD, "signinsalt", iterations=1000)
    User.objects.create(username="alice", password=hashed, is_staff=True)
    _, key = ApiKey.issue(name="signin-admin", role="admin")

    answers = [Browser(server).sign_in("alice", f"wrong-{n}")[0] for n in range(5)]
    assert answers == [200, 200, 200, 200, 429]
    status, page = Browser(server).sign_in("alice", PASSWORD)

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
