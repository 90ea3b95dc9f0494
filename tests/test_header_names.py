"""Request headers whose names contain `_` never reach the application (API.md, Security
v1.2), on both servers: `run_api` (taskforge.api.bridge) and gunicorn (gunicorn.conf.py).

In a WSGI environ `X-Forwarded-Proto` and `X_Forwarded_Proto` are the same key
(HTTP_X_FORWARDED_PROTO), so a server that kept the second would let it stand in for the
first: behind a trusted proxy that overwrites X-Forwarded-Proto, a client's
`X_Forwarded_Proto: https` would pass through the proxy untouched and make a plain HTTP
request count as HTTPS.  Both servers drop such headers, as nginx does.

The servers run with the proxy trusted (TASKFORGE_TRUST_PROXY) and the settings
tests.settings_echo: TaskForge's own, plus `/echo`, which answers what the view sees.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection

from tests.service import ROOT, api_process, database_url, free_port

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

START_BOUND = 30.0  # seconds a server gets to answer /healthz


@contextlib.contextmanager
def gunicorn(workdir: Path, env: dict[str, str]) -> Iterator[str]:
    """gunicorn with the project's gunicorn.conf.py; its base URL."""
    port = free_port()
    log = workdir / "gunicorn.log"
    full_env = {
        **env,
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": settings.REDIS_URL,
        "SECRET_KEY": settings.SECRET_KEY,
        "TASKFORGE_BIND": f"127.0.0.1:{port}",
        "TASKFORGE_WEB_WORKERS": "1",
        "TASKFORGE_WEB_THREADS": "4",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "taskforge.wsgi", "-c", "gunicorn.conf.py"],
            cwd=ROOT,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_BOUND
        while True:
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(OSError):
                if get(f"http://127.0.0.1:{port}", "/healthz", {})[0] == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(params=["run_api", "gunicorn"])
def server(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    transactional_db: None,
    redis_client: redis.Redis,
) -> Iterator[str]:
    """The base URL of a server of TaskForge behind a trusted proxy."""
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.settings_echo",
        "TASKFORGE_TRUST_PROXY": "true",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus"),
    }
    if request.param == "run_api":
        with api_process(tmp_path, env) as svc:
            yield svc.base_url
    else:
        with gunicorn(tmp_path, {**os.environ, **env}) as base_url:
            yield base_url


def get(
    base_url: str, path: str, headers: dict[str, str]
) -> tuple[int, http.client.HTTPResponse, bytes]:
    """A GET with exactly these headers (names kept as written, `_` included)."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("GET", path)
        for name, value in {**headers, "Connection": "close"}.items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response, response.read()
    finally:
        conn.close()


def seen(base_url: str, headers: dict[str, str], path: str = "/echo") -> dict[str, Any]:
    status, _, body = get(base_url, path, headers)
    assert status == 200, body
    answer: dict[str, Any] = json.loads(body)
    return answer


def test_underscored_forwarded_proto__does_not_make_a_request_https(server: str) -> None:
    assert seen(server, {"X-Forwarded-Proto": "https"})["secure"] is True  # trusted proxy
    view = seen(server, {"X_Forwarded_Proto": "https"})
    assert view["secure"] is False
    assert "HTTP_X_FORWARDED_PROTO" not in view["headers"]
    # Nor beside the proxy's own header (joined, a server would hand on "http,https").
    view = seen(server, {"X-Forwarded-Proto": "http", "X_Forwarded_Proto": "https"})
    assert view["secure"] is False
    assert view["headers"]["HTTP_X_FORWARDED_PROTO"] == "http"


def test_underscored_forwarded_proto__gets_no_https_only_headers(server: str) -> None:
    """A real page (the admin's sign-in): HSTS is sent on HTTPS answers only."""
    _, response, _ = get(server, "/admin/login/", {"X-Forwarded-Proto": "https"})
    assert response.getheader("Strict-Transport-Security")
    _, response, _ = get(server, "/admin/login/", {"X_Forwarded_Proto": "https"})
    assert response.getheader("Strict-Transport-Security") is None


def test_underscored_header__never_reaches_the_view_as_its_dashed_name(server: str) -> None:
    assert seen(server, {"X-Api-Key": "dashed"})["headers"]["HTTP_X_API_KEY"] == "dashed"
    view = seen(server, {"X_Api_Key": "underscored"})
    assert "HTTP_X_API_KEY" not in view["headers"]
    assert "underscored" not in json.dumps(view)
    view = seen(server, {"X-Api-Key": "dashed", "X_Api_Key": "underscored"})
    assert view["headers"]["HTTP_X_API_KEY"] == "dashed"
    # SCRIPT_NAME from a request header (gunicorn's forwarder_headers) is dropped as well.
    view = seen(server, {"Script_Name": "/x"}, path="/x/echo")
    assert view["script_name"] == ""
    assert "HTTP_SCRIPT_NAME" not in view["headers"]
