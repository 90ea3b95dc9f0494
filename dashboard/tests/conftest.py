"""Fixtures of the dashboard tests: staff browsers, and a fresh overview snapshot."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard import snapshot

PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # PBKDF2's real cost (about a second per user here) is no part of what these test.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _fresh_snapshot() -> Iterator[None]:
    # The overview snapshot is cached (in Redis, shared by processes) for a second and a half.
    snapshot.invalidate()
    yield
    snapshot.invalidate()


@pytest.fixture
def staff_user(db: None) -> User:
    return User.objects.create_user("oncall", password=PASSWORD, is_staff=True)


@pytest.fixture
def superuser(db: None) -> User:
    return User.objects.create_superuser("root", password=PASSWORD)


@pytest.fixture
def staff_client(staff_user: User) -> Client:
    client = Client()
    client.force_login(staff_user)
    return client


@pytest.fixture
def csrf_client(staff_user: User) -> Client:
    """A logged-in staff browser whose POSTs must carry the CSRF token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff_user)
    return client


@pytest.fixture
def superuser_client(superuser: User) -> Client:
    client = Client()
    client.force_login(superuser)
    return client
