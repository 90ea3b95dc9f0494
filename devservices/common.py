"""What every part of devservices shares: its errors, time limits and small helpers."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import sys
from pathlib import Path

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


def package_dir(distribution: str, module: str) -> Path:
    """Return where `module` is installed without importing it (imports have side effects)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise DevServicesError(
            f"the {distribution} package is not installed; run `make run` or "
            "`pip install -e '.[local,test]'`, or set DATABASE_URL and REDIS_URL"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def socket_path_ok(path: Path) -> bool:
    return len(os.fsencode(path)) <= MAX_SOCKET_PATH


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def write_private(path: Path, text: str) -> None:
    """Create `path` with mode 0600 (never readable by others, not even for a moment)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def tool_env() -> dict[str, str]:
    """Environment for the servers and their tools: no PG* variables that could redirect them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def display(path: Path) -> str:
    """`path` relative to the current directory when it is inside it, for friendlier messages."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
