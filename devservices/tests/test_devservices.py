"""devservices starts real Postgres and Redis servers and leaves nothing behind.

Each test runs ``python -m devservices`` as a subprocess from the repository root (devservices is
not installed, so that is where it is found), with DATABASE_URL and REDIS_URL removed from its
environment, so it starts its own servers even when the suite itself runs against other ones.
Throwaway directories go to the test's tmp_path (TMPDIR), which keeps the leftover checks
precise. No Django database is needed.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.service import Browser, free_port

DEVSERVICES = [sys.executable, "-m", "devservices"]
# Where `python -m devservices` finds the package; the children of `run` inherit it as their cwd.
REPO_ROOT = Path(__file__).resolve().parents[2]

# Connects the way the app does: psycopg and Django's settings (django-environ) for Postgres,
# redis-py for Redis.
CONNECT = textwrap.dedent(
    """
    import os, environ, psycopg, redis
    url = os.environ["DATABASE_URL"]
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("taskforge",)
    cfg = environ.Env.db_url_config(url)
    kwargs = {"host": cfg["HOST"] or None, "port": cfg["PORT"] or None, **cfg.get("OPTIONS", {})}
    with psycopg.connect(dbname=cfg["NAME"], user=cfg["USER"], **kwargs) as conn:
        conn.execute("SELECT 1")
    assert redis.Redis.from_url(os.environ["REDIS_URL"]).ping()
    print("OK")
    """
)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short temporary directory: Redis's socket path must fit in 107 bytes, and pytest's
    own tmp_path is longer in a test process of `make test` (popen-gwN): Redis then
    listens on TCP, and its command line no longer names the directory the tests look for."""
    path = Path(tempfile.mkdtemp(prefix="tf-ds-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.pop("SECRET_KEY", None)
    env["TMPDIR"] = str(tmp_path)
    env.update(extra)
    return env


def _devservices(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DEVSERVICES, *args],
        cwd=REPO_ROOT,
        env=env if env is not None else _env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


@contextlib.contextmanager
def _running(tmp_path: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """Start devservices with a child that prints "ready" and sleeps; yield once it is ready.

    On the way out a devservices still running gets SIGTERM (so it stops its servers), and
    SIGKILL only if that does not work.
    """
    child = "import time; print('ready', flush=True); time.sleep(60)"
    proc = subprocess.Popen(
        [*DEVSERVICES, "run", *args, "--", sys.executable, "-c", child],
        cwd=REPO_ROOT,
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=60), "devservices did not start its child in time"
        assert proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.communicate(timeout=30)


def _processes_using(path: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(path) in cmdline:
            found.append(f"{proc.pid}: {cmdline}")
    return found


def _throwaway_dirs(tmp_path: Path) -> list[Path]:
    return list(tmp_path.glob("taskforge-*"))


def test_run__throwaway_servers_answer_then_vanish(tmp_path: Path) -> None:
    result = _devservices(tmp_path, "run", "--throwaway", "--", sys.executable, "-c", CONNECT)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "OK"
    assert _throwaway_dirs(tmp_path) == []
    assert _processes_using(tmp_path) == []


def test_run__exit_code_of_the_child_is_returned(tmp_path: Path) -> None:
    result = _devservices(
        tmp_path, "run", "--throwaway", "--", sys.executable, "-c", "raise SystemExit(3)"
    )

    assert result.returncode == 3, result.stderr
    assert _throwaway_dirs(tmp_path) == []
    assert _processes_using(tmp_path) == []


def test_run__missing_command_is_an_error(tmp_path: Path) -> None:
    result = _devservices(tmp_path, "run", "--throwaway", "--", "no-such-command-xyz")

    assert result.returncode == 1
    assert "cannot run no-such-command-xyz" in result.stderr
    assert list(tmp_path.iterdir()) == []  # found out before starting anything


def test_run__data_dir_keeps_database_redis_and_secret_key(tmp_path: Path) -> None:
    data = tmp_path / "d"
    write = textwrap.dedent(
        """
        import os, psycopg, redis
        with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
            conn.execute("CREATE TABLE kept (v text)")
            conn.execute("INSERT INTO kept VALUES ('pg-ok')")
        redis.Redis.from_url(os.environ["REDIS_URL"]).set("kept", "redis-ok")
        print(os.environ["SECRET_KEY"])
        """
    )
    read = textwrap.dedent(
        """
        import os, psycopg, redis, subprocess, sys
        with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
            print(conn.execute("SELECT v FROM kept").fetchone()[0])
        print(redis.Redis.from_url(os.environ["REDIS_URL"]).get("kept").decode())
        print(os.environ["SECRET_KEY"])
        env = subprocess.run(
            [sys.executable, "-m", "devservices", "env", "--data", sys.argv[1]],
            capture_output=True, text=True, check=True,
        )
        print(env.stdout, end="")
        """
    )

    first = _devservices(tmp_path, "run", "--data", str(data), "--", sys.executable, "-c", write)
    assert first.returncode == 0, first.stderr
    assert _processes_using(data) == []
    second = _devservices(
        tmp_path, "run", "--data", str(data), "--", sys.executable, "-c", read, str(data)
    )

    assert second.returncode == 0, second.stderr
    lines = second.stdout.splitlines()
    assert lines[:2] == ["pg-ok", "redis-ok"]
    assert lines[2] == first.stdout.strip()  # the same SECRET_KEY both times
    assert (data / "secret_key").stat().st_mode & 0o777 == 0o600
    exports = "\n".join(lines[3:])
    assert "export DATABASE_URL=" in exports
    assert "export REDIS_URL=" in exports
    assert f"export SECRET_KEY={lines[2]}" in exports
    assert _processes_using(data) == []
    # Without a running `run`, `env` says so instead of printing stale URLs.
    after = _devservices(tmp_path, "env", "--data", str(data))
    assert after.returncode == 1
    assert after.stdout == ""


def test_run__sigterm_is_forwarded_and_servers_stop(tmp_path: Path) -> None:
    with _running(tmp_path, "--throwaway") as proc:
        assert len(_processes_using(tmp_path)) >= 2  # Postgres and Redis are up

        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)

    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert _throwaway_dirs(tmp_path) == []
    assert _processes_using(tmp_path) == []


def test_run__servers_left_by_a_killed_run_are_stopped_by_the_next(tmp_path: Path) -> None:
    data = tmp_path / "d"
    with _running(tmp_path, "--data", str(data)) as proc:
        proc.kill()  # no chance to clean up
        proc.wait(timeout=10)
    assert _processes_using(data), "the servers of the killed run should still be up"

    result = _devservices(tmp_path, "run", "--data", str(data), "--", sys.executable, "-c", CONNECT)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "OK"
    assert "left running" in result.stderr
    assert _processes_using(data) == []


def test_run__throwaway_dir_of_a_killed_run_is_swept_by_the_next(tmp_path: Path) -> None:
    with _running(tmp_path, "--throwaway") as proc:
        proc.kill()
        proc.wait(timeout=10)
    assert len(_throwaway_dirs(tmp_path)) == 1

    result = _devservices(tmp_path, "run", "--throwaway", "--", sys.executable, "-c", "pass")

    assert result.returncode == 0, result.stderr
    assert "left behind by a run that crashed" in result.stderr
    assert _throwaway_dirs(tmp_path) == []
    assert _processes_using(tmp_path) == []


def test_run__with_both_urls_set_starts_nothing(tmp_path: Path) -> None:
    env = _env(tmp_path, DATABASE_URL="postgres://u@db.invalid/x", REDIS_URL="redis://r.invalid/1")
    show = "import os; print(os.environ['DATABASE_URL'], os.environ['REDIS_URL'])"

    result = _devservices(tmp_path, "run", "--throwaway", "--", sys.executable, "-c", show, env=env)

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["postgres://u@db.invalid/x", "redis://r.invalid/1"]
    assert list(tmp_path.iterdir()) == []


def test_run__lets_push_requests_reach_loopback_unless_told_otherwise(tmp_path: Path) -> None:
    """`make run` allows a push target on this machine; TaskForge's own default blocks it,
    and a throwaway run (`make test`) keeps that default."""
    show = "import os; print(os.environ.get('TASKFORGE_PUSH_ALLOWED_NETWORKS', '-'))"
    urls = {"DATABASE_URL": "postgres://u@db.invalid/x", "REDIS_URL": "redis://r.invalid/1"}
    throwaway = ["run", "--throwaway", "--", sys.executable, "-c", show]
    result = _devservices(tmp_path, *throwaway, env=_env(tmp_path, **urls))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["-"]

    run = ["run", "--data", str(tmp_path / "data"), "--", sys.executable, "-c", show]

    result = _devservices(tmp_path, *run, env=_env(tmp_path, **urls))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["127.0.0.0/8,::1/128"]

    own = _env(tmp_path, **urls, TASKFORGE_PUSH_ALLOWED_NETWORKS="")
    result = _devservices(tmp_path, *run, env=own)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == []


# --- --setup: what `make run` makes on its first start ------------------------------

COUNT_STAFF = textwrap.dedent(
    """
    import os, psycopg
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        print(conn.execute("SELECT count(*) FROM auth_user").fetchone()[0])
    """
)


def _wait_ready(base_url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 150  # a first start: initdb, then every migration
    while True:
        try:
            with urllib.request.urlopen(f"{base_url}/readyz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.5)


def test_setup__first_start_prints_the_dashboard_and_a_staff_login_that_signs_in(
    tmp_path: Path,
) -> None:
    """`make run`: the banner names the dashboard and a password saved beside the admin
    key; the login signs in to the dashboard through the served sign-in form.  A later
    start makes none again and prints where the password is."""
    data = tmp_path / "d"
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = _env(tmp_path, TASKFORGE_BIND=f"127.0.0.1:{port}", TASKFORGE_WEB_WORKERS="1")
    log = tmp_path / "run.log"
    run = ["run", "--data", str(data), "--setup", "--"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*DEVSERVICES, *run, sys.executable, "manage.py", "run_api"],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(base_url, proc, log)
        banner = log.read_text()
        password = (data / "dashboard_password").read_text().strip()
        key = (data / "admin_api_key").read_text().strip()

        assert f"Dashboard: {base_url}/admin/dashboard/" in banner
        assert f"Sign in as admin with this password (saved in {data}/dashboard_password)" in (
            banner
        )
        assert f"    {password}\n" in banner and f"    {key}\n" in banner
        assert (data / "dashboard_password").stat().st_mode & 0o777 == 0o600
        assert Browser(base_url).sign_in("admin", password + "x")[0] == 200  # the form again
        browser = Browser(base_url)
        assert browser.sign_in("admin", password)[0] == 302
        status, page = browser.request("GET", "/admin/dashboard/")
        assert status == 200
        assert 'id="login-form"' not in page
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert _processes_using(data) == []

    again = _devservices(tmp_path, *run, sys.executable, "-c", COUNT_STAFF, env=env)

    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == "1"  # no second user (after migrate's lines)
    assert f"Sign in as admin; password saved in {data}/dashboard_password" in again.stderr
    assert password not in again.stderr
    assert (data / "dashboard_password").read_text().strip() == password


def test_setup__a_throwaway_run_makes_no_staff_login(tmp_path: Path) -> None:
    """`make test`'s servers (and any throwaway run) never get the local login."""
    result = _devservices(
        tmp_path, "run", "--throwaway", "--setup", "--", sys.executable, "-c", COUNT_STAFF
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "0"
    assert "Sign in as" not in result.stderr
    assert _throwaway_dirs(tmp_path) == []
