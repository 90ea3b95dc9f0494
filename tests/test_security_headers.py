"""Headers and cookies (issue 14, item 7): a strict CSP on the dashboard and admin,
HSTS and Secure cookies over TLS, and X-Forwarded-Proto trusted only behind a proxy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from dashboard.tests.conftest import PASSWORD
from taskforge.api.models import ApiKey
from tasks.tests.factories import TaskFactory
from tests.service import ROOT

D = "/admin/dashboard"
TEMPLATE_DIRS = [ROOT / "templates", ROOT / "dashboard" / "templates"]


class InlineFinder(HTMLParser):
    """Inline script and style in a page: what a strict CSP would block."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        for name, _ in attrs:
            if name.startswith("on"):
                self.found.append(f"<{tag} {name}=...>")
            if name == "style":
                self.found.append(f"<{tag} style=...>")
        if tag == "style":
            self.found.append("<style>")
        if tag == "script" and "src" not in named and named.get("type") != "application/json":
            self._in_script = True

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.found.append(f"<script>{data.strip()[:40]}")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False


def inline_parts(html: str) -> list[str]:
    finder = InlineFinder()
    finder.feed(html)
    return finder.found


def policy(response: Any) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {
        name: values for name, *values in (directive.split() for directive in header.split(";"))
    }


@pytest.fixture
def staff(db: None, settings: Any) -> Client:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    user = User.objects.create_superuser("root", password=PASSWORD)
    client = Client()
    client.force_login(user)
    return client


# -- CSP ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", TEMPLATE_DIRS, ids=lambda path: path.parent.name)
def test_templates__have_no_inline_script_or_style(directory: Path) -> None:
    for template in directory.rglob("*.html"):
        assert inline_parts(template.read_text()) == [], template


@pytest.mark.django_db
def test_dashboard_and_admin_pages__carry_a_strict_csp_and_no_inline_script(
    staff: Client,
) -> None:
    task = TaskFactory(status="dead")
    paths = [
        f"{D}/",
        f"{D}/tasks/",
        f"{D}/tasks/{task.pk}",
        f"{D}/dlq/",
        f"{D}/workers/",
        "/admin/",
        "/admin/api/apikey/",
        "/admin/login/",
    ]
    for path in paths:
        # The login page as a stranger sees it; the rest as staff.
        response = (Client() if path.endswith("login/") else staff).get(path)
        assert response.status_code == 200, path
        csp = policy(response)
        assert csp["script-src"] == ["'self'"], path
        assert csp["style-src"] == ["'self'"], path
        assert csp["object-src"] == ["'none'"], path
        assert csp["frame-ancestors"] == ["'none'"], path
        assert inline_parts(response.content.decode()) == [], path


@pytest.mark.django_db
def test_issued_key_page__has_no_inline_handler(staff: Client) -> None:
    """The page showing a new key once selected it with an inline onfocus=."""
    response = staff.post("/admin/api/apikey/add/", {"name": "ci", "role": "worker"})
    assert response.status_code == 200
    assert ApiKey.objects.filter(name="ci").exists()
    html = response.content.decode()
    assert "data-select-on-focus" in html
    assert inline_parts(html) == []
    assert "'unsafe-inline'" not in response["Content-Security-Policy"]


@pytest.mark.django_db
def test_api_answers__carry_a_policy_that_allows_nothing(admin_client: APIClient) -> None:
    response = admin_client.get("/queues")
    assert response["Content-Security-Policy"] == "default-src 'none'; frame-ancestors 'none'"


# -- TLS: HSTS and Secure cookies ---------------------------------------------------------------


@pytest.mark.django_db
def test_https_request__gets_hsts_and_secure_cookies(db: None, settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    User.objects.create_superuser("root", password=PASSWORD)
    client = Client()

    response = client.post("/admin/login/", {"username": "root", "password": PASSWORD}, secure=True)

    assert response.status_code == 302
    assert response["Strict-Transport-Security"] == "max-age=31536000"
    assert response.cookies["sessionid"]["secure"] is True
    assert response.cookies["csrftoken"]["secure"] is True


@pytest.mark.django_db
def test_plain_http_request__gets_neither(db: None, settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    User.objects.create_superuser("root", password=PASSWORD)

    response = Client().post("/admin/login/", {"username": "root", "password": PASSWORD})

    assert response.status_code == 302
    assert "Strict-Transport-Security" not in response
    assert not response.cookies["sessionid"]["secure"]


@pytest.mark.django_db
def test_forwarded_proto__is_not_trusted_by_default(db: None, settings: Any) -> None:
    """Regression for issue 14: X-Forwarded-Proto was trusted from anyone."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    User.objects.create_superuser("root", password=PASSWORD)

    response = Client().post(
        "/admin/login/",
        {"username": "root", "password": PASSWORD},
        HTTP_X_FORWARDED_PROTO="https",
    )

    assert "Strict-Transport-Security" not in response
    assert not response.cookies["sessionid"]["secure"]


# -- the proxy setting --------------------------------------------------------------------------


def proxy_header_with(trust: str | None) -> str:
    """SECURE_PROXY_SSL_HEADER as settings.py sets it from the environment."""
    env = {key: value for key, value in os.environ.items() if key != "TASKFORGE_TRUST_PROXY"}
    if trust is not None:
        env["TASKFORGE_TRUST_PROXY"] = trust
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import taskforge.settings as s; print(getattr(s, 'SECURE_PROXY_SSL_HEADER', None))",
        ],
        cwd=ROOT,
        env={**env, "SECRET_KEY": "x"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_trust_proxy__sets_the_proxy_header_only_when_true() -> None:
    assert proxy_header_with(None) == "None"
    assert proxy_header_with("false") == "None"
    assert proxy_header_with("true") == "('HTTP_X_FORWARDED_PROTO', 'https')"
