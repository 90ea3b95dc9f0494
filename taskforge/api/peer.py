"""Is the client of a request still connected?  For long polls."""

from __future__ import annotations

import select
import socket
from collections.abc import Callable

from django.http import HttpRequest
from rest_framework.request import Request


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
