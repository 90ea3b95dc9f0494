"""Staff passwords and sign-in throttling (API.md "Security (v1.2)", People).

Sign-ins go through Django admin's real login form; time passes by moving the
recorded attempts back (axes keeps them in Postgres), never by waiting.
"""

from __future__ import annotations

import io
import secrets
from datetime import timedelta
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db.models import F
from django.test import Client

from dashboard.tests.conftest import PASSWORD

LOCKED = "sign-in is locked for 15 minutes"
HERE, THERE = "203.0.113.7", "198.51.100.9"

pytestmark = pytest.mark.django_db


def sign_in(username: str, password: str, address: str = HERE) -> Any:
    return Client().post(
        "/admin/login/?next=/admin/",
        {"username": username, "password": password, "next": "/admin/"},
        REMOTE_ADDR=address,
    )


def signed_in(response: Any) -> bool:
    return bool(response.status_code == 302 and response["Location"] == "/admin/")


def locked(response: Any) -> bool:
    return bool(response.status_code == 429 and LOCKED in response.content.decode())


@pytest.fixture
def alice(db: None) -> User:
    return User.objects.create_user("alice", password=PASSWORD, is_staff=True)


@pytest.fixture
def bob(db: None) -> User:
    return User.objects.create_user("bob", password=PASSWORD, is_staff=True)


def refusals(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [
        (record.username, record.remote_addr)  # type: ignore[attr-defined]
        for record in caplog.records
        if record.getMessage() == "signin.refused"
    ]


def travel(by: timedelta) -> None:
    """As if `by` had passed since every failed sign-in recorded so far."""
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - by)


# -- 5 per user name --------------------------------------------------------------------------


def test_signin__five_wrong_passwords_lock_the_user_name_out(
    alice: User, caplog: pytest.LogCaptureFixture
) -> None:
    answers = [sign_in("alice", f"wrong-{n}") for n in range(5)]
    assert [a.status_code for a in answers[:4]] == [200] * 4  # the form: wrong password
    assert locked(answers[4])

    right = sign_in("alice", PASSWORD)

    assert locked(right)
    assert "sessionid" not in right.cookies
    html = right.content.decode()
    assert 'id="login-form"' in html  # the admin's login form, saying it is locked
    assert right["Content-Type"].startswith("text/html")
    assert refusals(caplog) == [("alice", HERE), ("alice", HERE)]


def test_signin__a_locked_user_name_is_locked_from_every_address(alice: User) -> None:
    for n in range(5):
        sign_in("alice", f"wrong-{n}", address=f"192.0.2.{n}")

    assert locked(sign_in("alice", PASSWORD, address=THERE))


def test_signin__others_are_not_affected_by_a_locked_user_name(alice: User, bob: User) -> None:
    for n in range(5):
        sign_in("alice", f"wrong-{n}")

    assert signed_in(sign_in("bob", PASSWORD))  # another user from the same address
    assert signed_in(sign_in("bob", PASSWORD, address=THERE))


def test_signin__four_failures_do_not_lock(alice: User) -> None:
    for n in range(4):
        sign_in("alice", f"wrong-{n}")

    assert signed_in(sign_in("alice", PASSWORD))


def test_signin__a_success_does_not_reset_the_count(alice: User) -> None:
    for n in range(4):
        sign_in("alice", f"wrong-{n}")
    assert signed_in(sign_in("alice", PASSWORD))

    assert locked(sign_in("alice", "wrong-4"))


def test_axes_reset_username__lifts_a_lock(alice: User) -> None:
    for n in range(5):
        sign_in("alice", f"wrong-{n}")

    call_command("axes_reset_username", "alice", stdout=io.StringIO())

    assert signed_in(sign_in("alice", PASSWORD))


# -- 20 per client address --------------------------------------------------------------------


def test_signin__twenty_failures_from_one_address_lock_it_out(
    alice: User, caplog: pytest.LogCaptureFixture
) -> None:
    answers = [sign_in(f"guess-{n}", "wrong") for n in range(20)]
    assert [a.status_code for a in answers[:19]] == [200] * 19
    assert locked(answers[19])

    assert locked(sign_in("alice", PASSWORD))  # a user with no failure of its own
    assert signed_in(sign_in("alice", PASSWORD, address=THERE))  # from elsewhere: in
    assert refusals(caplog) == [("guess-19", HERE), ("alice", HERE)]


def test_signin__nineteen_failures_from_one_address_do_not_lock(alice: User) -> None:
    for n in range(19):
        sign_in(f"guess-{n}", "wrong")

    assert signed_in(sign_in("alice", PASSWORD))


# -- the cool-off -----------------------------------------------------------------------------


def test_signin__the_lock_lasts_15_minutes_then_lifts(alice: User) -> None:
    for n in range(5):
        sign_in("alice", f"wrong-{n}")

    travel(timedelta(minutes=14, seconds=50))
    assert locked(sign_in("alice", PASSWORD))  # refused sign-ins do not extend it
    travel(timedelta(seconds=20))

    assert signed_in(sign_in("alice", PASSWORD))


def test_signin__the_lock_lasts_15_minutes_from_the_failure_that_caused_it(alice: User) -> None:
    """Failures from several addresses: the earliest must not lift the lock early."""
    sign_in("alice", "wrong", address="192.0.2.1")
    travel(timedelta(minutes=10))
    for n in range(2, 6):
        sign_in("alice", "wrong", address=f"192.0.2.{n}")  # the fifth locks it out

    travel(timedelta(minutes=6))  # 16 minutes after the first failure, 6 after the lock
    assert locked(sign_in("alice", PASSWORD))
    travel(timedelta(minutes=9, seconds=10))

    assert signed_in(sign_in("alice", PASSWORD))


def test_signin__failures_older_than_15_minutes_do_not_count(alice: User) -> None:
    for n in range(4):
        sign_in("alice", f"wrong-{n}")
    travel(timedelta(minutes=15, seconds=10))

    assert sign_in("alice", "wrong-again").status_code == 200
    assert signed_in(sign_in("alice", PASSWORD))


# -- the client address behind a trusted proxy ------------------------------------------------


def test_signin__behind_a_trusted_proxy_counts_the_forwarded_address(
    alice: User, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.TASKFORGE_TRUST_PROXY = True
    proxy = "10.0.0.2"

    def via_proxy(username: str, password: str, client: str) -> Any:
        return Client().post(
            "/admin/login/",
            {"username": username, "password": password},
            REMOTE_ADDR=proxy,
            # What the client sent first, then the address the proxy appended.
            HTTP_X_FORWARDED_FOR=f"192.0.2.250, {client}",
        )

    for n in range(20):
        via_proxy(f"guess-{n}", "wrong", HERE)

    assert locked(via_proxy("alice", PASSWORD, HERE))
    assert refusals(caplog)[-1] == ("alice", HERE)
    assert via_proxy("alice", PASSWORD, THERE).status_code == 302  # not the proxy's address


def test_signin__without_a_trusted_proxy_the_forwarded_address_is_ignored(alice: User) -> None:
    for n in range(20):
        Client().post(
            "/admin/login/",
            {"username": f"guess-{n}", "password": "wrong"},
            REMOTE_ADDR=HERE,
            HTTP_X_FORWARDED_FOR=f"192.0.2.{n}",  # anyone can send one
        )

    assert locked(sign_in("alice", PASSWORD))


# -- passwords --------------------------------------------------------------------------------


WEAK = {
    "short": "Xk3#pq",
    "common": "password1234",
    "numeric": "804613527913",
    "like the user name": "alice-operator-1",
}


@pytest.mark.parametrize("password", list(WEAK.values()), ids=list(WEAK))
def test_admin_password_change_form__refuses_a_weak_password(
    password: str, superuser: User
) -> None:
    user = User.objects.create_user(
        "alice-operator", password=PASSWORD, is_staff=True, email="alice@example.com"
    )
    client = Client()
    client.force_login(superuser)

    response = client.post(
        f"/admin/auth/user/{user.pk}/password/",
        {"password1": password, "password2": password},
    )

    assert response.status_code == 200  # the form again, with the error
    assert response.context["form"].errors
    user.refresh_from_db()
    assert user.check_password(PASSWORD)


def test_admin_password_change_form__takes_a_strong_password(superuser: User) -> None:
    user = User.objects.create_user("alice-operator", password=PASSWORD, is_staff=True)
    client = Client()
    client.force_login(superuser)
    strong = secrets.token_urlsafe(18)

    response = client.post(
        f"/admin/auth/user/{user.pk}/password/", {"password1": strong, "password2": strong}
    )

    assert response.status_code == 302
    user.refresh_from_db()
    assert user.check_password(strong)


def test_admin_add_user_form__refuses_a_weak_password(superuser: User) -> None:
    client = Client()
    client.force_login(superuser)

    response = client.post(
        "/admin/auth/user/add/",
        {"username": "carol", "password1": "short", "password2": "short"},
    )

    assert response.status_code == 200
    assert not User.objects.filter(username="carol").exists()


@pytest.mark.parametrize("password", list(WEAK.values()), ids=list(WEAK))
def test_changepassword__refuses_a_weak_password(password: str, monkeypatch: Any) -> None:
    user = User.objects.create_user("alice-operator", password=PASSWORD, is_staff=True)
    from django.contrib.auth.management.commands import changepassword

    # The command reads the password twice from the terminal, three tries.
    monkeypatch.setattr(changepassword.Command, "_get_pass", lambda self, prompt="": password)

    with pytest.raises(CommandError, match="after 3 attempts"):
        call_command("changepassword", "alice-operator", stdout=None)

    user.refresh_from_db()
    assert user.check_password(PASSWORD)


def test_changepassword__takes_a_strong_password(monkeypatch: Any) -> None:
    user = User.objects.create_user("alice-operator", password=PASSWORD, is_staff=True)
    from django.contrib.auth.management.commands import changepassword

    strong = secrets.token_urlsafe(18)
    monkeypatch.setattr(changepassword.Command, "_get_pass", lambda self, prompt="": strong)

    call_command("changepassword", "alice-operator")

    user.refresh_from_db()
    assert user.check_password(strong)


def test_validators__pass_a_generated_password() -> None:
    """What a generated staff login (secrets.token_urlsafe) would get passes."""
    for username in ("admin", "local-admin", "root"):
        validate_password(secrets.token_urlsafe(24), User(username=username))
    with pytest.raises(ValidationError):
        validate_password("admin", User(username="admin"))
