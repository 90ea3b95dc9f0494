"""taskforge.api.peer: the client's address, and telling that a long poll's client hung up."""

from __future__ import annotations

import os
import resource
import socket
from typing import Any

import pytest
from django.test import RequestFactory

from taskforge.api.peer import client_address, disconnected


def request_on(sock: socket.socket | None):
    request = RequestFactory().post("/workers/claim")
    if sock is not None:
        request.META["gunicorn.socket"] = sock
    return request


def test_disconnected__none_without_the_servers_socket() -> None:
    assert disconnected(request_on(None)) is None


def test_disconnected__true_once_the_client_closes() -> None:
    server, client = socket.socketpair()
    try:
        gone = disconnected(request_on(server))
        assert gone is not None
        assert gone() is False  # waiting for its answer: nothing to read
        client.sendall(b"x")  # a pipelined byte is not a hang-up (and is left unread)
        assert gone() is False
        assert server.recv(1) == b"x"
        client.close()
        assert gone() is True
        server.close()
        assert gone() is True  # closed on our side too
    finally:
        server.close()
        client.close()


def test_disconnected__a_descriptor_over_1024_is_still_read() -> None:
    """Regression for issue 14: select() refused descriptors >= 1024 and the check said
    "gone", so in a busy process every long poll ended after its first wait."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= 1500:
        if hard != resource.RLIM_INFINITY and hard <= 1500:
            pytest.skip(f"the descriptor limit ({hard}) allows no descriptor 1500")
        resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    server, client = socket.socketpair()
    high = socket.socket(fileno=os.dup2(server.fileno(), 1500))
    try:
        gone = disconnected(request_on(high))
        assert gone is not None
        assert gone() is False
        client.close()
        assert gone() is True
    finally:
        high.close()
        server.close()
        client.close()


def test_client_address__the_peer_without_a_trusted_proxy() -> None:
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="192.0.2.1")
    assert client_address(request) == "10.0.0.2"  # anyone can send the header


@pytest.mark.parametrize(
    ("forwarded", "expected"),
    [
        ("192.0.2.1", "192.0.2.1"),
        ("198.51.100.5, 192.0.2.1", "192.0.2.1"),  # the first came from the client
        ("198.51.100.5,192.0.2.1 ", "192.0.2.1"),
        ("", "10.0.0.2"),
        (None, "10.0.0.2"),
    ],
)
def test_client_address__behind_a_trusted_proxy_the_address_it_appended(
    settings: Any, forwarded: str | None, expected: str
) -> None:
    settings.TASKFORGE_TRUST_PROXY = True
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.2")
    if forwarded is not None:
        request.META["HTTP_X_FORWARDED_FOR"] = forwarded
    assert client_address(request) == expected
