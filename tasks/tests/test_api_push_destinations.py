"""Where a push URL may point, where it is set (API.md "Security (v1.2)", push destinations).

The delivery side (a host name resolved to a blocked address) is
workers/tests/test_push_destinations.py; through the real server,
tests/test_push_target_change.py.
"""

from __future__ import annotations

import pytest
from django.conf import LazySettings
from rest_framework.test import APIClient

from queues import push
from queues.models import Queue

pytestmark = pytest.mark.django_db

# Every literal (or numeric) form of an address in the default blocked networks.
BLOCKED_HOSTS = [
    "127.0.0.1",
    "127.255.255.254",
    "[::1]",
    "0.0.0.0",
    "[::]",
    "169.254.169.254",
    "[fe80::1]",
    "[fe80::1%25eth0]",
    "224.0.0.1",
    "[ff02::1]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[::ffff:169.254.169.254]",
    "[0:0:0:0:0:ffff:127.0.0.1]",
    "2130706433",
    "0x7f000001",
    "0X7F000001",
    "0177.0.0.1",
    "017700000001",
    "127.1",
    "127.0.1",
    "0x7f.0.0.1",
    "127.0.0.1.",
    "0",
    "\uff11\uff12\uff17.\uff10.\uff10.\uff11",  # full-width digits, read as 127.0.0.1
]


def _refused(response: object) -> None:
    assert response.status_code == 400, response.content  # type: ignore[attr-defined]
    error = response.json()["error"]  # type: ignore[attr-defined]
    assert error["code"] == "invalid"
    # `push` (a NUL anywhere is refused before: `push.url`, API.md Conventions).
    assert [name.split(".")[0] for name in error["fields"]] == ["push"]
    assert all(isinstance(m, str) and m for ms in error["fields"].values() for m in ms)


@pytest.mark.parametrize("host", BLOCKED_HOSTS)
def test_create__a_blocked_literal_address_is_400_naming_push(
    admin_client: APIClient, host: str
) -> None:
    body = {"name": "q", "push": {"url": f"http://{host}:8000/hook"}}
    _refused(admin_client.post("/queues", body, format="json"))
    assert not Queue.objects.filter(name="q").exists()


@pytest.mark.parametrize("host", BLOCKED_HOSTS)
def test_patch__a_blocked_literal_address_is_400_and_changes_nothing(
    admin_client: APIClient, host: str
) -> None:
    first = {"name": "q", "push": {"url": "https://a.example/"}}
    admin_client.post("/queues", first, format="json")
    body = {"push": {"url": f"https://{host}/hook", "headers": {"X-A": "1"}}}
    _refused(admin_client.patch("/queues/q", body, format="json"))
    assert Queue.objects.get(name="q").push == {
        "url": "https://a.example/",
        "timeout_seconds": 30,
        "headers": {},
    }


@pytest.mark.parametrize(
    "url",
    [
        "https://a.example/a b",
        "https://a.example/a\tb",
        "https://a.ex\tample/",
        "https://a.example/\x00",
        "https://a.example/\x1f",
        "https://a.example/\x7f",
        "https://a.example/\x85",
        "https://a.example/\u00a0",
        "https://a.example/\u2028",
        "https://a.example/x\n",
        " https://a.example/",
        "https://a.example/\r",
    ],
)
def test_create__a_url_with_a_space_tab_or_control_character_is_400(
    admin_client: APIClient, url: str
) -> None:
    _refused(admin_client.post("/queues", {"name": "q", "push": {"url": url}}, format="json"))
    first = {"name": "p", "push": {"url": "https://a.example/"}}
    admin_client.post("/queues", first, format="json")
    _refused(admin_client.patch("/queues/p", {"push": {"url": url}}, format="json"))
    assert (Queue.objects.get(name="p").push or {})["url"] == "https://a.example/"


@pytest.mark.parametrize(
    "host",
    ["10.0.0.5", "192.168.1.20", "172.16.0.1", "[fd00::5]", "8.8.8.8", "localhost", "a.example"],
)
def test_create__private_addresses_and_host_names_are_accepted(
    admin_client: APIClient, host: str
) -> None:
    # Private ranges are where a self-hosted queue's targets live; names are
    # judged at delivery, by the address they resolve to then.
    response = admin_client.post(
        "/queues", {"name": "q", "push": {"url": f"http://{host}/hook"}}, format="json"
    )
    assert response.status_code == 201, response.content


def test_allowed_networks_let_a_blocked_address_through(
    admin_client: APIClient, settings: LazySettings
) -> None:
    settings.TASKFORGE_PUSH_ALLOWED_NETWORKS = "127.0.0.0/8"
    for n, host in enumerate(["127.0.0.1", "[::ffff:127.0.0.1]"]):
        response = admin_client.post(
            "/queues", {"name": f"q{n}", "push": {"url": f"http://{host}:9/"}}, format="json"
        )
        assert response.status_code == 201, response.content
    # The rest of the default list still holds, and other numeric forms stay refused.
    for host in ["[::1]", "169.254.169.254", "2130706433"]:
        body = {"name": "r", "push": {"url": f"http://{host}/"}}
        _refused(admin_client.post("/queues", body, format="json"))


def test_blocked_networks_are_a_setting(admin_client: APIClient, settings: LazySettings) -> None:
    settings.TASKFORGE_PUSH_BLOCKED_NETWORKS = "10.0.0.0/8"
    for url in ["http://10.1.2.3/", "http://[::ffff:10.1.2.3]/"]:
        _refused(admin_client.post("/queues", {"name": "q", "push": {"url": url}}, format="json"))
    response = admin_client.post(
        "/queues", {"name": "q", "push": {"url": "http://127.0.0.1/"}}, format="json"
    )
    assert response.status_code == 201


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("127.0.0.1", False),
        ("::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:0.0.0.0", False),
        ("169.254.1.1", False),
        ("fe80::1%eth0", False),
        ("239.1.1.1", False),
        ("ff05::2", False),
        ("10.0.0.1", True),
        ("::ffff:10.0.0.1", True),
        ("2001:db8::1", True),
        ("93.184.216.34", True),
    ],
)
def test_address_allowed__the_default_lists(address: str, allowed: bool) -> None:
    assert push.address_allowed(address) is allowed


def test_check_url__is_a_function_of_the_url_alone() -> None:
    """The check a Cloud Tasks task's own URL goes through too: no queue involved."""
    assert push.check_url("https://a.example/x") == "https://a.example/x"
    with pytest.raises(push.DestinationNotAllowed, match=r"127\.0\.0\.1"):
        push.check_url("http://127.0.0.1:8080/")
    with pytest.raises(push.InvalidPush, match=r"would mean 127\.0\.0\.1"):
        push.check_url("http://0x7f000001/")
