"""The data directory of a run: its layout, lock, state for `env`, and leftovers of crashes."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from devservices.common import DevServicesError
from devservices.postgres import Postgres, grant_traverse
from devservices.redis import Redis

logger = logging.getLogger(__name__)

DEFAULT_DATA_DIR = ".taskforge"
THROWAWAY_PREFIX = "taskforge-"
THROWAWAY_MARKER = "throwaway"
LOCK_FILE = "devservices.lock"
STATE_FILE = "services.env"
SECRET_KEY_FILE = "secret_key"  # nosec B105
ADMIN_KEY_FILE = "admin_api_key"
DASHBOARD_PASSWORD_FILE = "dashboard_password"  # nosec B105


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
        self.dashboard_password = root / DASHBOARD_PASSWORD_FILE


@contextlib.contextmanager
def locked(lock_path: Path) -> Iterator[None]:
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
                f"`python -m devservices env --data {lock_path.parent}`"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # also releases the lock


def is_locked(lock_path: Path) -> bool:
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


def prepare_root(root: Path, *, for_postgres: bool) -> None:
    if not root.exists():
        root.mkdir(mode=0o700, parents=True)
    if for_postgres and os.geteuid() == 0:
        # The Postgres account must pass through (not list) the directory to reach pg/.
        root.chmod(stat.S_IMODE(root.stat().st_mode) | stat.S_IXOTH)
        grant_traverse(root)


def stop_leftovers(layout: Layout) -> None:
    """Stop servers that a crashed run left on `layout`; the caller holds the lock."""
    if (layout.pgdata / "postmaster.pid").exists():
        Postgres(layout.pgdata, layout.pg_log, durable=True).stop_leftover()
    if layout.redis_dir.exists():
        Redis(layout.redis_dir, layout.redis_log, durable=True).stop_leftover()
    layout.state.unlink(missing_ok=True)


def sweep_stale_throwaways() -> None:
    """Remove throwaway directories (and stop their servers) whose run died without cleaning up."""
    for root in Path(tempfile.gettempdir()).glob(THROWAWAY_PREFIX + "*"):
        layout = Layout(root)
        try:
            if not (root / THROWAWAY_MARKER).exists() or root.stat().st_uid != os.geteuid():
                continue
            with locked(layout.lock):
                logger.info("cleaning up %s, left behind by a run that crashed", root)
                stop_leftovers(layout)
                shutil.rmtree(root, ignore_errors=True)
        except (DevServicesError, OSError):
            continue  # in use by a live run, or already gone


def read_state(layout: Layout) -> dict[str, str]:
    state: dict[str, str] = {}
    for line in layout.state.read_text().splitlines():
        name, _, value = line.partition("=")
        if name:
            state[name] = value
    return state
