"""The command line: ``python -m devservices run|env|stop`` (see the package docstring)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

from devservices.app import app_defaults, run_setup
from devservices.common import DevServicesError, Terminated, write_private
from devservices.datadir import (
    DEFAULT_DATA_DIR,
    THROWAWAY_MARKER,
    THROWAWAY_PREFIX,
    Layout,
    is_locked,
    locked,
    prepare_root,
    read_state,
    stop_leftovers,
    sweep_stale_throwaways,
)
from devservices.postgres import DB_NAME, Postgres
from devservices.processes import run_child
from devservices.redis import Redis

logger = logging.getLogger(__name__)


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
            prepare_root(root, for_postgres=False)
            layout = Layout(root)
        app_defaults(env, layout)
        if setup:
            code = run_setup(env, None, fresh_database=False)
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
        sweep_stale_throwaways()
        root = Path(tempfile.mkdtemp(prefix=THROWAWAY_PREFIX))
    assert root is not None
    prepare_root(root, for_postgres=need_pg)
    layout = Layout(root)

    signal.signal(signal.SIGTERM, _raise_terminated)
    signal.signal(signal.SIGHUP, _raise_terminated)
    services: list[Postgres | Redis] = []
    try:
        with locked(layout.lock):
            if throwaway:
                # Only now (lock held) may a sweeper in another run consider this directory.
                (root / THROWAWAY_MARKER).touch()
            else:
                stop_leftovers(layout)
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
                added = app_defaults(env, None if throwaway else layout)
                exported.update((k, v) for k, v in added.items() if k != "SECRET_KEY")
                write_private(layout.state, "".join(f"{k}={v}\n" for k, v in exported.items()))
                code = 0
                if setup:
                    code = run_setup(
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
    if not is_locked(layout.lock) or not layout.state.exists():
        raise DevServicesError(
            f"no devservices run is using {layout.root}; start one with `make run`"
        )
    values = read_state(layout)
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
    with locked(layout.lock):
        stop_leftovers(layout)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devservices",
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
    """Entry point of ``python -m devservices``."""
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
