"""The client of a request: its address, and whether it is still connected."""

from __future__ import annotations

import select
import socket
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest
from rest_framework.request import Request


def client_address(request: HttpRequest) -> str | None:
    """The address of the client that sent `request`, as the request log and
    sign-in throttling name it.

    The peer of the connection (`REMOTE_ADDR`), unless a proxy is trusted to be
    in front (TASKFORGE_TRUST_PROXY): then every request comes from the proxy,
    and the client is the last address of `X-Forwarded-For`, the one the proxy
    itself appended (or set); the earlier ones came from the client and prove
    nothing.  Without the header, the peer.
    """
    if settings.TASKFORGE_TRUST_PROXY:
        forwarded: str = request.META.get("HTTP_X_FORWARDED_FOR", "")
        last = forwarded.rpartition(",")[2].strip()
        if last:
            return last
    address: str | None = request.META.get("REMOTE_ADDR")
    return address


def disconnected(request: HttpRequest | Request) -> Callable[[], bool] | None:
    """A check that says True once the client has closed its connection.

    Under `run_api` the server tells (taskforge.api.bridge puts the check in
    the environ as `taskforge.disconnected`).  Under gunicorn the socket is
    read (`gunicorn.socket`).  None where neither is there (the test client).
    On gunicorn's socket, a client that closed its end makes the socket
    readable with nothing to read; one still waiting for its answer sends
    nothing, so the socket is not readable.
    Behind a proxy that keeps its upstream connection open, it never says
    True: the check is best effort.
    """
    told = request.META.get("taskforge.disconnected")
    if callable(told):
        return told  # type: ignore[no-any-return]
    sock = request.META.get("gunicorn.socket")
    if not isinstance(sock, socket.socket):
        return None

    def check() -> bool:
        # poll(), not select(): select() refuses a descriptor >= 1024, which a
        # busy process reaches; read as "gone", every long poll would end after
        # its first wait slice.
        if sock.fileno() < 0:
            return True  # closed on our side
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        try:
            if not poller.poll(0):
                return False
            return sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:  # reset
            return True

    return check
