"""taskforge.api.peer: telling that a long poll's client hung up."""

from __future__ import annotations

import os
import resource
import socket

import pytest
from django.test import RequestFactory

from taskforge.api.peer import disconnected


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
