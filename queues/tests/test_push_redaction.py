"""The one rule of what a push target shows to anyone but an admin key (API.md v1.2
"Secrets in push settings"): `redacted`, its inverse for forms `unredacted`, and
`scrubbed` for free text (errors, log fields)."""

from __future__ import annotations

import pytest

from queues import push

SECRET_URL = "https://bot:pa55word@Hooks.Example.com:8443/in/tasks?token=qt0ken&v=2"
STORED = push.parse(
    {
        "url": SECRET_URL,
        "timeout_seconds": 10,
        "headers": {"Authorization": "Bearer s3cret", "X-Api-Key": "k3y-value"},
    }
).as_json()


def test_redacted__keeps_scheme_host_port_path_and_header_names_only() -> None:
    assert push.redacted(STORED) == {
        "url": "https://hooks.example.com:8443/in/tasks",
        "timeout_seconds": 10,
        "headers": {"Authorization": "[redacted]", "X-Api-Key": "[redacted]"},
    }


def test_redacted__is_idempotent_and_passes_null_through() -> None:
    assert push.redacted(push.redacted(STORED)) == push.redacted(STORED)
    assert push.redacted(None) is None


def test_redacted__an_ipv6_host_keeps_its_brackets() -> None:
    stored = push.parse({"url": "http://u:p@[2001:db8::1]:8080/x?t=1"}).as_json()
    assert push.redacted(stored)["url"] == "http://[2001:db8::1]:8080/x"


def test_redacted__a_url_that_does_not_parse_is_hidden_whole() -> None:
    assert push.redacted({"url": "http://h:99999/?t=1", "headers": {}})["url"] == "[redacted]"
    assert push.redacted({"url": 5})["url"] == "[redacted]"


def test_unredacted__what_was_shown_sent_back_keeps_every_secret() -> None:
    posted = push.parse(push.redacted(STORED))
    assert push.unredacted(posted, STORED).as_json() == STORED


def test_unredacted__values_typed_anew_replace_the_stored_ones() -> None:
    shown = push.redacted(STORED)
    shown["headers"]["X-Api-Key"] = "new-key"
    shown["url"] = "https://hooks.example.com:8443/in/tasks?token=rotated"
    shown["timeout_seconds"] = 20
    assert push.unredacted(push.parse(shown), STORED).as_json() == {
        "url": "https://hooks.example.com:8443/in/tasks?token=rotated",
        "timeout_seconds": 20,
        "headers": {"Authorization": "Bearer s3cret", "X-Api-Key": "new-key"},
    }


def test_unredacted__a_header_dropped_is_gone_and_names_match_without_case() -> None:
    posted = push.parse(
        {
            "url": "https://hooks.example.com:8443/in/tasks",
            "headers": {"authorization": "[redacted]"},
        }
    )
    assert push.unredacted(posted, STORED).headers == {"authorization": "Bearer s3cret"}


@pytest.mark.parametrize("stored", [None, STORED])
def test_unredacted__a_redacted_value_with_nothing_stored_is_refused(stored: object) -> None:
    posted = push.parse({"url": "https://a.example/", "headers": {"X-New": "[redacted]"}})
    with pytest.raises(push.InvalidPush, match="X-New"):
        push.unredacted(posted, stored)


def test_unredacted__another_url_does_not_inherit_the_stored_query() -> None:
    posted = push.parse({"url": "https://other.example/in/tasks"})
    assert push.unredacted(posted, STORED).url == "https://other.example/in/tasks"


def test_scrubbed__removes_header_values_user_info_and_query_as_written_and_quoted() -> None:
    target = push.parse(
        {
            "url": "https://bot:pa55word@h.example/x?token=t%C3%B6ken-1&flag=on",
            "headers": {"X-Api-Key": "k3y-value", "X-Env": "a"},
        }
    )
    text = (
        "400, message='bad', url='https://h.example/x?token=t%C3%B6ken-1&flag=on' "
        "echo: k3y-value, tök: token=tö" + "ken-1, pa55word, bot"
    )
    scrubbed = push.scrubbed(text, target)
    for secret in ("k3y-value", "t%C3%B6ken-1", "töken-1", "pa55word"):
        assert secret not in scrubbed
    assert "url='https://h.example/x?[redacted]'" in scrubbed
    # Names are no secret; a value too short to be one is left (else every "a" would go).
    assert "token=" in scrubbed and "message='bad'" in scrubbed
