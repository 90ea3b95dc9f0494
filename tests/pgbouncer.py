"""A throwaway pgbouncer in front of the test Postgres, for tests/test_pgbouncer.py.

Debian's `pgbouncer` (`make test` installs it when it runs as root; see the
Makefile), started in a temporary directory on a free loopback port with a
configuration of its own: the test database twice, once pooled in
**transaction** mode under its own name and once in **session** mode under
`<name>_session` (where the loops LISTEN), `auth_type = trust` with the
test's role in its userlist (Postgres does the real check).  pgbouncer
refuses to run as root: as root it runs as the account that owns the
Postgres socket directory (the embedded Postgres of `make test`), else as
`postgres` or `nobody`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg

from tests.service import free_port

SBIN = "/usr/sbin/pgbouncer"  # Debian's path, off a normal user's PATH
POOL_SIZE = 20  # server connections per database and user, whatever the clients


def pgbouncer_binary() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    return SBIN if os.access(SBIN, os.X_OK) else None


def _account(host: str) -> pwd.struct_passwd | None:
    """Who pgbouncer runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    if host.startswith("/"):
        owner = pwd.getpwuid(os.stat(host).st_uid)
        if owner.pw_uid != 0:
            return owner  # it can reach the socket it owns
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root and there is no account to run pgbouncer as")


class PgBouncer:
    """pgbouncer for one database of one server (a Django DATABASES entry)."""

    def __init__(self, database: Mapping[str, Any], *, pool_size: int = POOL_SIZE) -> None:
        self.pool_size = pool_size
        self.name: str = database["NAME"]
        self.user: str = database.get("USER") or "postgres"
        self.password: str = database.get("PASSWORD") or ""
        options = database.get("OPTIONS", {})
        self.server_host: str = database.get("HOST") or options.get("host") or "127.0.0.1"
        self.server_port = int(database.get("PORT") or 5432)
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="tfbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, *, session: bool = False) -> str:
        """DATABASE_URL through pgbouncer: the transaction pool, or the session pool."""
        name = f"{self.name}_session" if session else self.name
        auth = f"{self.user}:{self.password}" if self.password else self.user
        return f"postgres://{auth}@127.0.0.1:{self.port}/{name}"

    @property
    def log(self) -> Path:
        return self.directory / "pgbouncer.log"

    def _config(self) -> str:
        server = f"host={self.server_host} port={self.server_port} dbname={self.name}"
        return f"""\
[databases]
{self.name} = {server} pool_mode=transaction
{self.name}_session = {server} pool_mode=session

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.directory}/userlist.txt
admin_users = {self.user}
pool_mode = transaction
default_pool_size = {self.pool_size}
max_client_conn = 1000
server_login_retry = 1
logfile = {self.log}
pidfile = {self.directory}/pgbouncer.pid
"""

    def start(self) -> None:
        binary = pgbouncer_binary()
        assert binary is not None
        (self.directory / "pgbouncer.ini").write_text(self._config())
        # pgbouncer itself checks no password under trust; Postgres checks the real one.
        (self.directory / "userlist.txt").write_text(f'"{self.user}" ""\n')
        account = _account(self.server_host)
        kwargs: dict[str, Any] = {}
        if account is not None:
            for path in (self.directory, *self.directory.iterdir()):
                os.chown(path, account.pw_uid, account.pw_gid)
            kwargs = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        with (self.directory / "stderr.log").open("wb") as stderr:
            self.process = subprocess.Popen(
                [binary, str(self.directory / "pgbouncer.ini")],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                **kwargs,
            )
        deadline = time.monotonic() + 15
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"pgbouncer did not start:\n{self.tail()}") from None
                time.sleep(0.1)

    def show(self, what: str) -> list[dict[str, Any]]:
        """`SHOW <what>` on pgbouncer's admin console (POOLS, CLIENTS, SERVERS, STATS...)."""
        auth = f"{self.user}:{self.password}" if self.password else self.user
        url = f"postgres://{auth}@127.0.0.1:{self.port}/pgbouncer"
        # The console speaks the simple protocol only, and knows no transactions.
        with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
            cursor = psycopg.ClientCursor(conn)
            cursor.execute(f"SHOW {what}")
            names = [column.name for column in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def tail(self, lines: int = 40) -> str:
        path = self.log if self.log.exists() else self.directory / "stderr.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)
