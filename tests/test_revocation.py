"""Revocation within a second (API.md v1.1 Authentication; issue 14, item 6).

Before, each API process remembered a valid key for 5 s after it was revoked,
and a long poll in progress went on to its deadline.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from rest_framework.test import APIClient

from taskforge.api import revocation
from taskforge.api.models import ApiKey
from tests.helpers import assert_error
from tests.service import API, ROOT, Api, Service, database_url

# Revocation is promised within 1 s; scheduling noise on a small machine on top.
WITHIN = 1.0
SLACK = 0.3


def wait_subscribed() -> None:
    deadline = time.monotonic() + 5
    while not revocation.listener.subscribed():
        assert time.monotonic() < deadline, "the revocation listener did not subscribe"
        time.sleep(0.02)


def until(predicate: Callable[[], bool], timeout: float) -> float:
    """Seconds until `predicate()` held; fails after `timeout`."""
    began = time.monotonic()
    while not predicate():
        assert time.monotonic() - began < timeout, "timed out"
        time.sleep(0.02)
    return time.monotonic() - began


# -- the command ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_revokeapikey__revokes_every_active_key_of_that_name() -> None:
    issued = [ApiKey.issue(name="ci", role="producer")[0] for _ in range(2)]
    other = ApiKey.issue(name="other", role="producer")[0]
    out = StringIO()

    call_command("revokeapikey", "ci", stdout=out)

    assert "Revoked 2" in out.getvalue()
    assert all(ApiKey.objects.get(pk=key.pk).revoked for key in issued)
    assert not ApiKey.objects.get(pk=other.pk).revoked


@pytest.mark.django_db
def test_revokeapikey__unknown_name_is_an_error() -> None:
    with pytest.raises(CommandError, match="No API key named 'nope'"):
        call_command("revokeapikey", "nope")


@pytest.mark.django_db(transaction=True)
def test_revokeapikey__exit_status_and_stderr(tmp_path: Path) -> None:
    ApiKey.issue(name="ci", role="worker")
    env = {
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": settings.REDIS_URL,
        "SECRET_KEY": "revocation-secret-key",
        "PATH": "/usr/bin:/bin",
    }

    def run(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", "revokeapikey", name],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = run("ci")
    assert done.returncode == 0, done.stderr
    missing = run("nope")
    assert missing.returncode == 1
    assert "No API key named 'nope'" in missing.stderr
    assert missing.stdout == ""


# -- one process: the remembered key ----------------------------------------------------------


@pytest.mark.django_db
def test_remembered_key__stops_working_when_another_process_revokes_it(
    redis_client: redis.Redis,
) -> None:
    """Another process revokes: the row changes, and the channel names the key."""
    wait_subscribed()
    key_row, key = ApiKey.issue(name="w", role="admin")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/queues").status_code == 200  # remembered from now on

    ApiKey.objects.filter(pk=key_row.pk).update(revoked=True)  # as another process would
    revocation.publish(revocation.key_topic(key_row.pk))

    took = until(lambda: client.get("/queues").status_code == 401, timeout=WITHIN)
    assert took < WITHIN
    assert_error(client.get("/queues"), 401, "unauthenticated")


@pytest.mark.django_db
def test_remembered_key__is_not_trusted_while_the_listener_is_not_subscribed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A message missed while Redis was away must not leave a revoked key working."""
    key_row, key = ApiKey.issue(name="w", role="admin")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert client.get("/queues").status_code == 200
    monkeypatch.setattr(revocation.listener, "_subscribed", False)

    ApiKey.objects.filter(pk=key_row.pk).update(revoked=True)  # and no message

    assert client.get("/queues").status_code == 401


# -- two processes: the API server, and this test revoking ------------------------------------


@pytest.fixture(scope="module")
def api_server(
    tmp_path_factory: pytest.TempPathFactory, django_db_setup: None
) -> Iterator[Service]:
    """The API alone (run_api, two worker processes), on the test database."""
    svc = Service(
        tmp_path_factory.mktemp("revocation"),
        {
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "revocation-secret-key",
            "TASKFORGE_WEB_WORKERS": "2",
            "TASKFORGE_WEB_THREADS": "8",
        },
    )
    try:
        svc.spawn(API)
        svc.wait_ready([API])
        yield svc
    finally:
        svc.stop()


@pytest.mark.django_db(transaction=True)
def test_revocation__reaches_every_process_and_ends_long_polls_within_a_second(
    api_server: Service,
) -> None:
    admin = Api(api_server.base_url, ApiKey.issue(name="admin", role="admin")[1])
    admin.ok("POST", "/queues", {"name": "revoked-q"})
    worker = Api(api_server.base_url, ApiKey.issue(name="doomed", role="worker")[1])
    # Both server processes remember the key (each answers some of these).
    for _ in range(40):
        assert worker.call("GET", "/queues")[0] == 200
    polls: list[tuple[int, Any, float]] = []

    def long_poll() -> None:
        status, body = worker.call(
            "POST",
            "/workers/claim",
            {"worker_id": "w1", "queues": ["revoked-q"], "wait_seconds": 20},
            timeout=30,
        )
        polls.append((status, body, time.monotonic()))

    threads = [threading.Thread(target=long_poll) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # the polls are waiting
    assert polls == []

    call_command("revokeapikey", "doomed", stdout=StringIO())  # this process, not the server's
    revoked_at = time.monotonic()

    # Every request after the first second is refused, whichever process answers it.
    took = until(lambda: worker.call("GET", "/queues")[0] == 401, timeout=WITHIN + SLACK)
    assert took < WITHIN + SLACK
    statuses = [worker.call("GET", "/queues")[0] for _ in range(20)]
    assert statuses == [401] * 20
    for thread in threads:
        thread.join(timeout=WITHIN + SLACK + 1)
    assert len(polls) == 4
    for status, body, ended_at in polls:
        assert status == 401, body
        assert body["error"]["code"] == "unauthenticated"
        assert ended_at - revoked_at < WITHIN + SLACK
    assert admin.call("GET", "/queues")[0] == 200  # other keys go on working


# -- a subscription that dies without a word ----------------------------------------------------


class MutableProxy:
    """A TCP proxy to REDIS_URL's server that can stop passing its answers on: a
    connection that dies without a word, as in a network partition."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.mute = threading.Event()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()  # a connection accepted while closing is closed too
        self.closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                return
            with self.lock:
                if self.closed:
                    client.close()
                    upstream.close()
                    return
                self.sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket, answers: bool) -> None:
        while True:
            try:
                data = source.recv(65536)
                if not data:
                    return
                if not (answers and self.mute.is_set()):
                    target.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.server.close()
            for sock in self.sockets:
                sock.close()


def test_listener__gives_up_a_silent_subscription_and_wakes_its_watchers(
    settings: Any,
) -> None:
    """A connection that dies without a word must not leave remembered keys trusted."""
    real = redis.connection.parse_url(settings.REDIS_URL)
    proxy = MutableProxy(real.get("host", "127.0.0.1"), real.get("port", 6379))
    settings.REDIS_URL = f"redis://127.0.0.1:{proxy.port}/{real.get('db', 0)}"
    listener = revocation.Listener()
    woken = threading.Event()
    try:
        with listener.watch(revocation.key_topic(1), woken):
            until(listener.subscribed, timeout=5)
            assert listener.trusted_epoch() is not None
            time.sleep(2 * revocation.SILENCE_SECONDS)  # pings answered: still subscribed
            assert listener.subscribed() and not woken.is_set()

            proxy.mute.set()
            took = until(woken.is_set, timeout=revocation.SILENCE_SECONDS + 2)
            assert took < revocation.SILENCE_SECONDS + 1
            assert not listener.subscribed()
            assert listener.trusted_epoch() is None

            proxy.mute.clear()  # the network is back: it subscribes again
            until(listener.subscribed, timeout=5)
    finally:
        proxy.close()
