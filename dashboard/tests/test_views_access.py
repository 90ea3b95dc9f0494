"""Every dashboard page and action: who may see it, which methods, CSRF."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.forms import Form
from django.test import Client

from dashboard.forms import AuditFilterForm, DlqFilterForm, TaskSearchForm
from dashboard.tests.pages import ANY_ID, D
from queues.models import Queue
from queues.tests.factories import QueueFactory

pytestmark = pytest.mark.django_db


PAGES = [
    f"{D}/",
    f"{D}/stream",
    f"{D}/tasks/",
    f"{D}/tasks/{ANY_ID}",
    f"{D}/tasks/{ANY_ID}/status",
    f"{D}/dlq/",
    f"{D}/workers/",
    f"{D}/audit/",
    f"{D}/queues/q/purge",
]
ACTIONS = [
    f"{D}/queues/q/pause",
    f"{D}/queues/q/resume",
    f"{D}/queues/q/purge",
    f"{D}/tasks/{ANY_ID}/cancel",
    f"{D}/dlq/replay",
    f"{D}/dlq/discard",
    f"{D}/dlq/{ANY_ID}/replay",
    f"{D}/dlq/{ANY_ID}/discard",
]


# Access ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PAGES + ACTIONS)
def test_access__anonymous_is_sent_to_the_admin_login(path: str) -> None:
    QueueFactory(name="q")
    method = Client().post if path in ACTIONS else Client().get

    response = method(path)

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=")


@pytest.mark.parametrize("path", PAGES + ACTIONS)
def test_access__a_logged_in_user_who_is_not_staff_is_refused(path: str) -> None:
    QueueFactory(name="q")
    client = Client()
    client.force_login(User.objects.create_user("visitor", password="x"))
    method = client.post if path in ACTIONS else client.get

    response = method(path)

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    assert Queue.objects.get(name="q").paused is False


@pytest.mark.parametrize("path", [p for p in ACTIONS if not p.endswith("/purge")])
def test_actions__answer_405_to_get(path: str, staff_client: Client) -> None:
    QueueFactory(name="q")

    assert staff_client.get(path).status_code == 405


@pytest.mark.parametrize(
    "path", [f"{D}/", f"{D}/tasks/", f"{D}/dlq/", f"{D}/workers/", f"{D}/audit/"]
)
def test_pages__answer_405_to_post(path: str, staff_client: Client) -> None:
    assert staff_client.post(path).status_code == 405


@pytest.mark.parametrize("path", ACTIONS)
def test_actions__refuse_a_post_without_the_csrf_token(path: str, csrf_client: Client) -> None:
    QueueFactory(name="q")

    response = csrf_client.post(path, {"confirm": "q", "all": "1"})

    assert response.status_code == 403
    assert Queue.objects.get(name="q").paused is False


def test_actions__accept_a_post_with_the_csrf_token(csrf_client: Client) -> None:
    QueueFactory(name="q")
    csrf_client.get(f"{D}/")  # sets the CSRF cookie, as a browser would

    response = csrf_client.post(
        f"{D}/queues/q/pause", {"csrfmiddlewaretoken": csrf_client.cookies["csrftoken"].value}
    )

    assert response.status_code == 302
    assert Queue.objects.get(name="q").paused is True


FILTERS = {
    f"{D}/tasks/": TaskSearchForm,
    f"{D}/dlq/": DlqFilterForm,
    f"{D}/audit/": AuditFilterForm,
}


@pytest.mark.parametrize(("page", "form"), FILTERS.items(), ids=["tasks", "dlq", "audit"])
def test_filters__nul_in_any_filter_is_refused_by_the_page(
    page: str, form: type[Form], viewer_client: Client
) -> None:
    """API.md Security (v1.2): a NUL in a dashboard filter never gives a 5xx; the page
    shows itself with that filter refused."""
    QueueFactory(name="q")
    for name in form.base_fields:
        for value in ("%00", "a%00b", "q%00"):
            response = viewer_client.get(f"{page}?{name}={value}")
            assert response.status_code == 200, (name, value, response.status_code)
            assert response.context["form"].errors, (name, value)
