"""The whole TaskForge service as real OS processes, for end-to-end fault tests.

`Service` starts the API (`run_api`) and the three loops (`run_dispatcher`,
`run_scheduler`, `run_watchdog`; `extra_loops=("pusher",)` adds `run_pusher`)
as child processes of the test, each in its own process group, against the
database and Redis given in its environment.
It can SIGKILL, SIGTERM and restart any one of them, waits for `/readyz` and
for each loop's `loop.started` line, keeps each process's stderr in a file
(one per start: `dispatcher.1.log`, `dispatcher.2.log`, ...) and always stops
everything in `stop()` (SIGTERM, then SIGKILL after a grace period).

`Api` is the other side: a plain HTTP client, the same thing a worker written
against API.md alone would use (no TaskForge imports); `Browser` signs in to the
dashboard the way a browser posts the admin's login form.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent

LOOPS = ("dispatcher", "scheduler", "watchdog")
API = "api"

# Knobs turned down so faults heal in seconds, not minutes.
FAST_KNOBS: dict[str, str] = {
    "TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS": "2",
    "TASKFORGE_WATCHDOG_INTERVAL_SECONDS": "0.5",
    "TASKFORGE_BUFFER_RECONCILE_SECONDS": "1.5",
    "TASKFORGE_SCHEDULER_TICK_SECONDS": "0.2",
    "TASKFORGE_DISPATCHER_TICK_SECONDS": "0.5",
    "TASKFORGE_RETRY_BASE_MS": "50",
    "TASKFORGE_RETRY_MAX_DELAY_MS": "500",
    "TASKFORGE_BUFFER_SIZE": "200",
    "TASKFORGE_WEB_WORKERS": "2",
    # Two API processes and three loops share one Postgres with other test runs.
    "DATABASE_POOL_MAX": "8",
    "LOG_LEVEL": "INFO",
}

START_TIMEOUT = 30.0
STOP_GRACE = 5.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def database_url(settings: Mapping[str, Any]) -> str:
    """A postgres:// URL for a Django DATABASES entry (e.g. the test database)."""
    user = urllib.parse.quote(settings.get("USER") or "", safe="")
    password = urllib.parse.quote(settings.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    # django-environ puts a socket directory (`?host=/dir`) in OPTIONS, not HOST.
    host = settings.get("HOST") or settings.get("OPTIONS", {}).get("host") or "127.0.0.1"
    name = urllib.parse.quote(settings["NAME"], safe="")
    if host.startswith("/"):
        # A unix-socket directory (make test's embedded Postgres): it goes in the query.
        return f"postgres://{auth}/{name}?host={urllib.parse.quote(host, safe='/')}"
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{name}"


@dataclass
class Proc:
    name: str
    argv: list[str]
    popen: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    log_path: Path | None = None
    starts: int = 0
    logs: list[Path] = field(default_factory=list)


class Service:
    """The API (run_api) + the three loops, as child processes."""

    def __init__(
        self, workdir: Path, env: Mapping[str, str], *, extra_loops: tuple[str, ...] = ()
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.env = {
            **os.environ,
            **FAST_KNOBS,
            **env,
            "TASKFORGE_BIND": f"127.0.0.1:{self.port}",
            "PYTHONUNBUFFERED": "1",
        }
        python = sys.executable
        self.killed_at_stop: list[str] = []
        self.procs: dict[str, Proc] = {
            API: Proc(API, [python, "manage.py", "run_api"]),
            **{
                name: Proc(name, [python, "manage.py", f"run_{name}"])
                for name in LOOPS + extra_loops
            },
        }

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def knob(self, name: str) -> float:
        return float(self.env[f"TASKFORGE_{name}"])

    # -- lifecycle --

    def start(self) -> None:
        for name in self.procs:
            self.spawn(name)
        self.wait_ready()

    def spawn(self, name: str) -> None:
        proc = self.procs[name]
        assert proc.popen is None or proc.popen.poll() is not None, f"{name} is running"
        self._reap(proc)
        proc.starts += 1
        proc.log_path = self.workdir / f"{name}.{proc.starts}.log"
        proc.logs.append(proc.log_path)
        proc.log = proc.log_path.open("wb")
        proc.popen = subprocess.Popen(
            proc.argv,
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=proc.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: gunicorn's workers go with it
        )

    def kill(self, name: str) -> None:
        """SIGKILL one process (and its process group) and reap it."""
        popen = self.procs[name].popen
        assert popen is not None and popen.poll() is None, f"{name} is not running"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(timeout=10)

    def signal(self, name: str, signum: int, timeout: float) -> tuple[int | None, float]:
        """Send `signum` to one process and wait for it to exit.

        Returns its exit code (None if it still runs after `timeout`) and the seconds taken.
        """
        popen = self.procs[name].popen
        assert popen is not None and popen.poll() is None, f"{name} is not running"
        began = time.monotonic()
        popen.send_signal(signum)
        try:
            code: int | None = popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        return code, time.monotonic() - began

    def signal_all(
        self, names: list[str], signum: int, timeout: float
    ) -> dict[str, tuple[int | None, float]]:
        """Send `signum` to several processes at once and wait for them to exit.

        Returns name -> (exit code, or None if still running after `timeout`; seconds taken).
        """
        popens = {}
        for name in names:
            popen = self.procs[name].popen
            assert popen is not None and popen.poll() is None, f"{name} is not running"
            popens[name] = popen
        began = time.monotonic()
        for popen in popens.values():
            popen.send_signal(signum)
        exits: dict[str, tuple[int | None, float]] = {}
        while len(exits) < len(popens) and time.monotonic() - began < timeout:
            for name, popen in popens.items():
                if name not in exits and popen.poll() is not None:
                    exits[name] = (popen.returncode, time.monotonic() - began)
            time.sleep(0.01)
        for name in popens:
            exits.setdefault(name, (None, time.monotonic() - began))
        return exits

    def restart(self, *names: str) -> None:
        for name in names:
            self.spawn(name)
        self.wait_ready(names=list(names))

    def wait_ready(self, names: list[str] | None = None, timeout: float = START_TIMEOUT) -> None:
        """Until /readyz answers 200 and each loop has logged `loop.started`."""
        names = list(self.procs) if names is None else names
        deadline = time.monotonic() + timeout
        waiting = set(names)
        while waiting:
            for name in sorted(waiting):
                popen = self.procs[name].popen
                assert popen is not None
                if popen.poll() is not None:
                    raise AssertionError(
                        f"{name} exited with {popen.returncode} while starting\n{self.tails()}"
                    )
                if self._is_ready(name):
                    waiting.discard(name)
            if waiting and time.monotonic() > deadline:
                raise AssertionError(
                    f"not ready after {timeout}s: {sorted(waiting)}\n{self.tails()}"
                )
            if waiting:
                time.sleep(0.05)

    def _is_ready(self, name: str) -> bool:
        if name == API:
            try:
                status, _ = Api(self.base_url).call("GET", "/readyz", timeout=2)
            except OSError:
                return False
            return status == 200
        return b'"event": "loop.started"' in self.log_text(name).encode()

    def running(self) -> dict[str, bool]:
        return {
            name: proc.popen is not None and proc.popen.poll() is None
            for name, proc in self.procs.items()
        }

    def assert_running(self) -> None:
        down = [name for name, up in self.running().items() if not up]
        assert not down, f"processes died: {down}\n{self.tails()}"

    def stop(self) -> None:
        """SIGTERM each process; SIGKILL what is left (process groups) after STOP_GRACE."""
        live = [p for p in self.procs.values() if p.popen is not None and p.popen.poll() is None]
        for proc in live:
            assert proc.popen is not None
            # Only to the API's master, which drains and stops its workers (a signal to
            # the whole group makes the workers hang now and then).
            with contextlib.suppress(ProcessLookupError):
                proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for proc in live:
            assert proc.popen is not None
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.killed_at_stop = [
            p.name for p in live if p.popen is not None and p.popen.poll() is None
        ]
        for proc in self.procs.values():
            if proc.popen is not None:
                # Also any gunicorn worker left behind by a master that already exited.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=10)
            self._reap(proc)

    def _reap(self, proc: Proc) -> None:
        if proc.log is not None:
            proc.log.close()
            proc.log = None

    # -- logs --

    def log_text(self, name: str, start: int | None = None) -> str:
        """The output of one start of a process (the latest by default)."""
        proc = self.procs[name]
        path = proc.log_path if start is None else proc.logs[start - 1]
        if path is None or not path.exists():
            return ""
        return path.read_text(errors="replace")

    def log_lines(self, name: str) -> list[dict[str, Any]]:
        """Every JSON log line of every start of a process."""
        lines = []
        for path in self.procs[name].logs:
            for raw in path.read_text(errors="replace").splitlines():
                if raw.startswith("{"):
                    with contextlib.suppress(ValueError):
                        lines.append(json.loads(raw))
        return lines

    def tails(self, lines: int = 25) -> str:
        out = []
        for name, proc in self.procs.items():
            for path in proc.logs:
                text = path.read_text(errors="replace").splitlines() if path.exists() else []
                out.append(f"----- {path.name} (last {lines} of {len(text)} lines) -----")
                out.extend(line[:400] for line in text[-lines:])
            popen = proc.popen
            if popen is not None:
                out.append(f"----- {name}: returncode={popen.poll()}")
        return "\n".join(out)


class Api:
    """A minimal JSON-over-HTTP client: one connection per call, nothing shared."""

    def __init__(self, base_url: str, key: str | None = None) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.key = key

    def call(
        self, method: str, path: str, body: Any = None, *, timeout: float = 30.0
    ) -> tuple[int, Any]:
        headers = {"Accept": "application/json", "Connection": "close"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return response.status, parsed

    def ok(self, method: str, path: str, body: Any = None, *, timeout: float = 30.0) -> Any:
        """`call`, asserting a 2xx answer; returns the JSON body."""
        status, parsed = self.call(method, path, body, timeout=timeout)
        assert 200 <= status < 300, f"{method} {path} -> {status}: {parsed}"
        return parsed


class Browser:
    """The admin's login form, posted the way a browser posts it (CSRF cookie and field)."""

    def __init__(self, base_url: str) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.cookies: dict[str, str] = {}

    def request(
        self, method: str, path: str, form: dict[str, str] | None = None
    ) -> tuple[int, str]:
        headers = {"Connection": "close"}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            text = response.read().decode()
            for value in response.headers.get_all("Set-Cookie") or []:
                name, _, rest = value.partition("=")
                self.cookies[name] = rest.split(";", 1)[0]
        finally:
            conn.close()
        return response.status, text

    def sign_in(self, username: str, password: str) -> tuple[int, str]:
        """The answer to the form's POST: 302 to /admin/ when the sign-in worked."""
        status, page = self.request("GET", "/admin/login/")
        assert status == 200
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert match
        form = {"csrfmiddlewaretoken": match[1], "username": username, "password": password}
        return self.request("POST", "/admin/login/?next=/admin/", {**form, "next": "/admin/"})


def children(parent: int, count: int) -> list[int]:
    """The pids of `parent`'s `count` child processes (a server's workers), waited for
    (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                # pid (comm) state ppid ...: comm may hold spaces, so split after it.
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                continue  # exited meanwhile
            if int(fields[1]) == parent:
                found.append(int(stat.parent.name))
        if len(found) == count:
            return sorted(found)
        assert time.monotonic() < deadline, found
        time.sleep(0.1)


@contextlib.contextmanager
def paused(pids: list[int]) -> Iterator[None]:
    """These processes stopped (SIGSTOP) meanwhile: they accept no connection, so
    another process of the same listening socket takes every one."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def api_process(workdir: Path, env: Mapping[str, str]) -> Iterator[Service]:
    """`run_api` alone, as one process serving the database and Redis the test uses
    (Django's test database: what the test commits, the server sees) with the test's
    SECRET_KEY (a session the test signs in is the server's).  Stopped on exit."""
    from django.conf import settings
    from django.db import connection

    svc = Service(
        workdir,
        {
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": settings.SECRET_KEY,
            **env,
        },
    )
    svc.spawn(API)
    try:
        svc.wait_ready([API])
        yield svc
    finally:
        svc.stop()


class Keys:
    """An API key per role, named `<prefix>-<role>` (in the test's database)."""

    def __init__(self, prefix: str) -> None:
        from taskforge.api.models import ApiKey

        self.admin = ApiKey.issue(name=f"{prefix}-admin", role="admin")[1]
        self.producer = ApiKey.issue(name=f"{prefix}-producer", role="producer")[1]
        self.worker = ApiKey.issue(name=f"{prefix}-worker", role="worker")[1]
