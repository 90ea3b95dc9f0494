"""Streamed answers through `run_api` (API.md, Security v1.2: static files and the
dashboard's event stream reach the browser whole, as through any server).

Django streams two kinds of answer: whitenoise's static files (file iterators) and the
dashboard's server-sent events.  The bridge sends them chunk by chunk from a pool thread
through granian's transport; an answer that stopped after its first chunk came out as a
script cut at 4,096 bytes and a stream that sent `retry:` and closed.

A real `run_api` process serving the test database, a signed-in staff user's cookie, and
plain HTTP: every static file the dashboard's pages, Django admin's and the API reference
page load arrives with as many bytes as its Content-Length and its file on disk.
"""

from __future__ import annotations

import http.client
import time
import urllib.parse
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.staticfiles import finders
from django.test import Client

from dashboard import snapshot
from queues.models import Queue
from tasks.tests.factories import TaskFactory
from tests.service import Service, api_process

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]

STREAM_BOUND = 20.0  # seconds a stream may take to show what is awaited


@pytest.fixture
def server(tmp_path: Path, transactional_db: None, redis_client: redis.Redis) -> Iterator[Service]:
    with api_process(tmp_path, {}) as svc:
        yield svc


@pytest.fixture
def cookie(transactional_db: None) -> str:
    """A signed-in superuser's session cookie (sessions live in the shared database)."""
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="unused-password-1"))
    return f"sessionid={client.cookies['sessionid'].value}"


class AssetFinder(HTMLParser):
    """The files a page makes the browser load: <script src> and <link href>."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        url = named.get("src") if tag == "script" else named.get("href") if tag == "link" else None
        if url:
            self.urls.add(url)


def get(svc: Service, path: str, cookie: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One GET; the body as far as it came (a cut answer is returned as cut)."""
    conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=30)
    headers = {"Connection": "close", **({"Cookie": cookie} if cookie else {})}
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        try:
            body = response.read()
        except http.client.IncompleteRead as cut:
            body = cut.partial
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        conn.close()


def static_files(svc: Service, cookie: str) -> set[str]:
    """The static paths the pages load, found in their HTML as a staff user gets it."""
    task = TaskFactory(queue=Queue.objects.create(name="pages-q"), status="dead")
    user = User.objects.get(username="root")
    pages = [
        "/admin/dashboard/",
        "/admin/dashboard/tasks/",
        f"/admin/dashboard/tasks/{task.pk}",
        "/admin/dashboard/dlq/",
        "/admin/dashboard/workers/",
        "/admin/dashboard/audit/",
        "/admin/dashboard/schedules/",
        "/admin/",
        "/admin/auth/user/",
        f"/admin/auth/user/{user.pk}/change/",
        "/api/docs/",
    ]
    found: set[str] = set()
    for page in pages:
        status, _, body = get(svc, page, cookie)
        assert status == 200, f"{page}: {status}"
        finder = AssetFinder()
        finder.feed(body.decode())
        for url in finder.urls:
            path = urllib.parse.urlsplit(urllib.parse.urljoin(page, url)).path
            if path.startswith(settings.STATIC_URL):
                found.add(path)
    return found


def test_static_files__every_file_the_pages_load_arrives_whole(
    server: Service, cookie: str
) -> None:
    paths = static_files(server, cookie)
    prefix = settings.STATIC_URL
    # The pages' own: the dashboard's script and styles, admin's, the reference page's.
    assert f"{prefix}dashboard/dashboard.js" in paths, paths
    assert f"{prefix}admin/css/base.css" in paths, paths
    assert any("swagger-ui" in path for path in paths), paths
    cut = []
    for path in sorted(paths):
        on_disk = finders.find(path.removeprefix(prefix))
        assert isinstance(on_disk, str), f"{path}: no such static file"
        status, headers, body = get(server, path)
        assert status == 200, f"{path}: {status}"
        size = Path(on_disk).stat().st_size
        if not len(body) == int(headers["content-length"]) == size:
            cut.append(f"{path}: {len(body)} of {headers['content-length']} (file: {size})")
    assert not cut, "\n".join(cut)


def read_events(response: http.client.HTTPResponse, until: float) -> Iterator[dict[str, str]]:
    """The stream's events (`field: value` blocks), as they come, until `until`."""
    buffer = b""
    while time.monotonic() < until:
        chunk = response.read1(65536)
        if not chunk:
            return  # the server ended the stream
        buffer += chunk
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            fields = dict(line.split(": ", 1) for line in block.decode().splitlines())
            yield fields


def test_event_stream__sends_the_snapshot_and_later_ones(server: Service, cookie: str) -> None:
    """The dashboard's stream: `retry`, the snapshot at once, and later snapshots that
    show what changed meanwhile."""
    snapshot.invalidate()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=STREAM_BOUND)
    try:
        conn.request("GET", "/admin/dashboard/stream", headers={"Cookie": cookie})
        response = conn.getresponse()
        assert response.status == 200
        assert response.getheader("content-type", "").startswith("text/event-stream")
        events = read_events(response, until=time.monotonic() + STREAM_BOUND)
        assert "retry" in next(events)
        first = next(events, None)
        assert first is not None and first.get("event") == "snapshot", "no snapshot came"
        assert "late-q" not in first["data"]
        Queue.objects.create(name="late-q")
        later = next((event for event in events if "late-q" in event.get("data", "")), None)
        assert later is not None, f"no snapshot within {STREAM_BOUND} s showed the new queue"
        assert later["event"] == "snapshot"
    finally:
        conn.close()
