"""Fixtures of the dashboard tests: staff browsers, and a fresh overview snapshot."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from dashboard import roles, snapshot

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


def make_staff(username: str, group: str | None) -> User:
    """A staff user in `group` (none: staff with no permission at all)."""
    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    if group is not None:
        # A transactional test before this one may have flushed the migration's groups.
        roles.ensure_groups()
        user.groups.add(Group.objects.get(name=group))
    return user


@pytest.fixture
def staff_user(db: None) -> User:
    """On call: a staff user in TaskForge operators."""
    return make_staff("oncall", roles.OPERATORS)


@pytest.fixture
def viewer_user(db: None) -> User:
    return make_staff("viewer", roles.VIEWERS)


@pytest.fixture
def viewer_client(viewer_user: User) -> Client:
    client = Client()
    client.force_login(viewer_user)
    return client


@pytest.fixture
def bare_staff_client(db: None) -> Client:
    """Staff, in no group and with no permission."""
    client = Client()
    client.force_login(make_staff("bare", None))
    return client


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
