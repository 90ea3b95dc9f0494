"""The production HTTP server of the API, as `manage.py run_api` starts it.

granian serves `taskforge.rsgi:application` (Django behind
`taskforge.api.bridge`) in `workers` processes.  The server's settings are
read here and nowhere else, for `run_api` and for `gunicorn.conf.py` alike
(README, Configuration):

- TASKFORGE_BIND (`0.0.0.0:8080`), TASKFORGE_WEB_WORKERS (number of cores);
- TASKFORGE_WEB_THREADS (1024): the thread pool of each process; a waiting
  long poll holds one thread (idle), every other request one for its
  duration, so a host holds about WORKERS x THREADS waiting workers;
- TASKFORGE_HEADER_TIMEOUT_SECONDS (10): a connection whose request head has
  not arrived within this is closed (slow clients);
- TASKFORGE_BODY_TIMEOUT_SECONDS (30): likewise for the body, answered 408.

Stopping, SIGTERM and SIGINT alike, drains: each process is first told
(SIGUSR1) to end its waiting long polls (they answer empty within a second),
then stops accepting, lets requests in flight finish and exits; a process
still busy after `KILL_TIMEOUT` seconds is killed.  The server exits 0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import multiprocessing
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

from taskforge.lib import stopping

# A request in flight gets this long to finish once the server stops.
KILL_TIMEOUT = 10
# Processes are recycled now and then so a slow leak cannot grow without bound.
WORKER_LIFETIME_SECONDS = 24 * 3600
# glibc's malloc serves allocations from this size up with their own mappings (below).
MMAP_THRESHOLD_BYTES = 128 * 1024
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
# Signal from the server to its processes: end the waiting long polls now.
DRAIN_SIGNAL = signal.SIGUSR1


# granian's own lines (start, stop, a worker respawned) as JSON on stderr, like ours.
_GRANIAN_LOGGING: dict[str, Any] = {
    "formatters": {"json": {"()": "taskforge.lib.logging.JsonFormatter"}},
    "handlers": {
        name: {"formatter": "json", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"}
        for name in ("console", "access")
    },
}


@dataclass(frozen=True)
class ServerSettings:
    bind: str
    host: str
    port: int
    workers: int
    threads: int
    header_timeout: float
    body_timeout: float

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ServerSettings:
        """From `environ` (default: this process's environment)."""
        environ = os.environ if environ is None else environ
        bind = environ.get("TASKFORGE_BIND", "0.0.0.0:8080")  # nosec B104 - as above
        host, _, port = bind.rpartition(":")
        return cls(
            bind=bind,
            # All interfaces: the documented default of TASKFORGE_BIND (a container's port).
            host=host.strip("[]") or "0.0.0.0",  # nosec B104
            port=int(port),
            workers=int(environ.get("TASKFORGE_WEB_WORKERS", multiprocessing.cpu_count())),
            threads=int(environ.get("TASKFORGE_WEB_THREADS", 1024)),
            header_timeout=float(environ.get("TASKFORGE_HEADER_TIMEOUT_SECONDS", 10)),
            body_timeout=float(environ.get("TASKFORGE_BODY_TIMEOUT_SECONDS", 30)),
        )

    @property
    def local_url(self) -> str:
        """Where a browser on this host reaches the server (`make run`'s banner)."""
        host = "localhost" if self.host in ("0.0.0.0", "::") else self.host  # nosec B104
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"


def prepare_process() -> None:
    """In each server process, once the application is loaded.

    DRAIN_SIGNAL ends the waiting long polls (it only sets a flag).

    The ~90k objects Django, DRF and the URLconf leave at import live as long
    as the process; a full collection scanned them all, a 50-60 ms pause for
    every request in flight (measured).  Frozen, the pauses stay under ~10 ms;
    a first generation of 10,000 allocations instead of 700 makes collections
    ~10x rarer for the same work.
    """

    def drain(signum: int, frame: FrameType | None) -> None:
        stopping.stop()  # waiting long polls answer within a second

    signal.signal(DRAIN_SIGNAL, drain)
    fix_mmap_threshold()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def fix_mmap_threshold() -> None:
    """Keep glibc's malloc from holding on to the memory of large requests.

    glibc serves an allocation of 128 KiB or more with a mapping of its own,
    returned to the system when freed, but raises that threshold (up to
    32 MiB) each time such a block is freed, so after one large request later
    ones (256 KiB payloads, a 4 MiB page) come from the heaps of the threads
    that made them, which are rarely given back.  Fixed at 128 KiB, eight
    concurrent pages of 500 tasks with 256 KiB payloads left each process
    8-59 MB above where it began, a second later; with the moving threshold,
    ~120 MB.  Without glibc (musl, macOS) this does nothing.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def serve() -> None:
    """Run the server until it is stopped (blocks)."""
    from granian.constants import Interfaces, Loops
    from granian.http import HTTP1Settings
    from granian.server import MPServer

    class Server(MPServer):
        def signal_handler_interrupt(self, *args: Any, **kwargs: Any) -> None:
            for process in list(self.wrks):
                pid = process.inner.pid
                if pid is not None:
                    try:
                        os.kill(pid, DRAIN_SIGNAL)
                    except ProcessLookupError:
                        pass
            super().signal_handler_interrupt(*args, **kwargs)  # type: ignore[no-untyped-call]

    conf = ServerSettings.from_environ()
    Server(
        "taskforge.rsgi:application",
        address=conf.host,
        port=conf.port,
        interface=Interfaces.RSGI,
        workers=conf.workers,
        # uvloop: the loop's own work per request (the bridge's hand-offs) in C.
        loop=Loops.uvloop,
        # Requests each process takes on at once: every waiting poll is one.
        backpressure=conf.threads,
        backlog=2048,
        http1_settings=HTTP1Settings(header_read_timeout=int(conf.header_timeout * 1000)),
        websockets=False,
        log_access=False,  # requests are logged by Django (taskforge.api.request_log)
        log_dictconfig=_GRANIAN_LOGGING,
        respawn_failed_workers=True,
        workers_lifetime=WORKER_LIFETIME_SECONDS,
        workers_kill_timeout=KILL_TIMEOUT,
        process_name=None,
    ).serve()
