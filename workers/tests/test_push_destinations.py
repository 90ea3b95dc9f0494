"""Where a push request may connect, at delivery (API.md "Security (v1.2)", push destinations).

The default settings block loopback.  A listening socket that must see no
connection is a plain socket whose backlog is looked at afterwards: a
connection the kernel completed would be there to accept.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult
from django.conf import LazySettings

from queues import push
from queues.models import Queue
from queues.tests.factories import QueueFactory
from tasks.models import Task, TaskStatus
from tests.pushtarget import Target
from workers import destinations
from workers.delivery import Job, Outcome, deliver
from workers.tests.test_pusher import enqueue, pushing, settled, wait_for

pytestmark = pytest.mark.timeout(90)

S = TaskStatus
PREFIX = "destination not allowed: "


@contextmanager
def listener(host: str = "127.0.0.1", port: int = 0) -> Iterator[socket.socket]:
    """A listening socket nobody accepts on (its backlog shows any connection made)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(16)
    try:
        yield sock
    finally:
        sock.close()


def connections_made(sock: socket.socket) -> int:
    sock.setblocking(False)
    count = 0
    while True:
        try:
            accepted, _ = sock.accept()
        except BlockingIOError:
            return count
        accepted.close()
        count += 1


def port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


class ScriptedResolver(AbstractResolver):
    """A DNS server whose answer to each lookup is the next of `answers` (it may change
    between lookups: a rebinding attack)."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.lookups = 0

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.lookups += 1
        address = self.answers.pop(0)
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        ]

    async def close(self) -> None:
        pass


def attempt(url: str, resolver: AbstractResolver | None = None) -> Outcome:
    """One delivery attempt with the push sender's connector (a new one: no pooled
    connection), as `workers.pusher.Sender` makes it."""
    job = Job("00000000-0000-0000-0000-000000000001", "q", 1, b"{}", push.PushTarget(url, 5))

    async def run() -> Outcome:
        connector, guarded = destinations.connector(10, resolver)
        try:
            async with aiohttp.ClientSession(connector=connector) as session:
                return await deliver(session, job, secret="")
        finally:
            await guarded.close()

    return asyncio.run(run())


def test_a_name_resolving_to_a_blocked_address_makes_no_connection() -> None:
    with listener() as sock:
        outcome = attempt(f"http://localhost:{port_of(sock)}/hook")
        assert connections_made(sock) == 0
    assert outcome.error == PREFIX + "127.0.0.1"
    assert outcome.kind == "connection_error"


@pytest.mark.parametrize("host", ["127.0.0.1", "[::ffff:127.0.0.1]"])
def test_a_literal_blocked_address_makes_no_connection(host: str) -> None:
    """A URL stored before the rules (or the settings) changed: the address it
    names is checked where the connection is made."""
    with listener() as sock:
        outcome = attempt(f"http://{host}:{port_of(sock)}/hook")
        assert connections_made(sock) == 0
    assert outcome.error is not None and outcome.error.startswith(PREFIX), outcome.error


def test_allowed_networks_let_a_name_through(settings: LazySettings) -> None:
    settings.TASKFORGE_PUSH_ALLOWED_NETWORKS = "127.0.0.0/8"
    with Target() as target:
        outcome = attempt(f"http://localhost:{target.port}/hook")
    assert outcome.error is None and outcome.kind == "success"
    assert len(target.requests) == 1


def test_a_dns_answer_that_changes_cannot_slip_through(settings: LazySettings) -> None:
    """The address checked is the address connected to: one lookup per attempt, and
    the connection goes to an address of that answer, never to a later one's."""
    settings.TASKFORGE_PUSH_ALLOWED_NETWORKS = "127.0.0.1/32"  # 127.0.0.2 stays blocked
    with Target() as target, listener("127.0.0.2", target.port) as blocked:
        url = f"http://rebind.test:{target.port}/hook"
        # First lookup: an allowed address; any later one: a blocked one.
        dns = ScriptedResolver("127.0.0.1", "127.0.0.2", "127.0.0.2")
        first = attempt(url, dns)
        assert first.error is None and dns.lookups == 1
        assert len(target.requests) == 1
        second = attempt(url, dns)
        assert dns.lookups == 2  # no second lookup between the check and the connection
        assert second.error == PREFIX + "127.0.0.2"
        assert connections_made(blocked) == 0
    assert len(target.requests) == 1


def test_an_answer_with_blocked_and_allowed_addresses_connects_to_an_allowed_one(
    settings: LazySettings,
) -> None:
    settings.TASKFORGE_PUSH_ALLOWED_NETWORKS = "127.0.0.1/32"

    class Mixed(ScriptedResolver):
        async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
        ) -> list[ResolveResult]:
            first = await super().resolve(host, port, family)
            second = await super().resolve(host, port, family)
            return second + first  # the blocked one first

    with Target() as target, listener("127.0.0.2", target.port) as blocked:
        outcome = attempt(f"http://mixed.test:{target.port}/", Mixed("127.0.0.1", "127.0.0.2"))
        assert connections_made(blocked) == 0
    assert outcome.error is None
    assert len(target.requests) == 1


@pytest.mark.django_db(transaction=True)
def test_run_pusher__a_blocked_destination_is_a_failed_attempt(redis_client: Any) -> None:
    """Through the push loop on real Postgres and Redis: the task is retried with the
    documented last_error, and the target saw no connection."""
    with listener() as sock:
        queue = QueueFactory(
            name="inside",
            push=push.parse({"url": f"http://localhost:{port_of(sock)}/hook"}).as_json(),
        )
        with pushing():
            ids = enqueue(queue, {"n": 1})
            wait_for(settled(ids, S.RETRY))
        assert connections_made(sock) == 0
    task = Task.objects.get(pk=ids[0])
    assert task.last_error == PREFIX + "127.0.0.1"
    assert task.attempts == 1


@pytest.mark.django_db(transaction=True)
def test_run_pusher__allowed_networks_let_it_through(
    redis_client: Any, settings: LazySettings
) -> None:
    settings.TASKFORGE_PUSH_ALLOWED_NETWORKS = "127.0.0.0/8,::1/128"
    with Target() as target:
        queue: Queue = QueueFactory(
            name="inside", push=push.parse({"url": f"http://localhost:{target.port}/"}).as_json()
        )
        with pushing():
            ids = enqueue(queue, {"n": 1})
            wait_for(settled(ids, S.DONE))
    assert len(target.requests) == 1
