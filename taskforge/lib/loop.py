"""The shape of every TaskForge loop: a `Loop` with `tick()`, run by a `LoopCommand`.

- `tick()` does one unit of work in its own short transaction(s) and returns
  True when it did work (run again at once) or False (wait `interval`).
- SIGTERM and SIGINT only set `stopping`; the loop finishes its tick, runs
  `on_shutdown()` and the command exits 0.
- An exception (a Postgres or Redis outage, say) is logged at the tick
  boundary and the loop backs off and tries again; it never dies of it.
- Any number of copies may run at once: every tick claims its rows with
  SKIP LOCKED or compare-and-set, never by assuming it is alone.
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
)

from taskforge.conf import conf

logger = logging.getLogger("taskforge.loop")

SLEEP_SLICE = 0.5
MAX_BACKOFF = 10.0


class Loop:
    """Base class: subclasses set `name` and implement `tick()` and `interval`."""

    name = "loop"

    def __init__(self) -> None:
        self.stopping = False
        self.failures = 0

    @property
    def interval(self) -> float:
        return 1.0

    def tick(self) -> bool:
        raise NotImplementedError

    def on_shutdown(self) -> None:
        """Release anything this process holds; runs once after the last tick."""

    def wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, in slices, returning early once stopping.

        Subclasses that can be woken (LISTEN/NOTIFY) override this.
        """
        deadline = time.monotonic() + seconds
        while not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(SLEEP_SLICE, left))

    def run(self, *, once: bool = False) -> int:
        """Tick until stopped; return the process exit code."""
        logger.info("loop.started", extra={"loop": self.name})
        try:
            while not self.stopping:
                if not connection.in_atomic_block:
                    close_old_connections()
                busy = self._safe_tick()
                if once:
                    break
                limit = conf.MAX_TICK_FAILURES
                if limit and self.failures >= limit:
                    logger.error(
                        "loop.giving_up", extra={"loop": self.name, "failures": self.failures}
                    )
                    return 1
                if self.failures:
                    self.wait(min(MAX_BACKOFF, 0.5 * 2 ** (self.failures - 1)))
                elif not busy:
                    self.wait(self.interval)
        finally:
            self._safe_shutdown()
            logger.info("loop.stopped", extra={"loop": self.name})
        return 0

    def _safe_tick(self) -> bool:
        try:
            busy = self.tick()
        except Exception as exc:
            self.failures += 1
            logger.exception(
                "loop.tick_failed",
                extra={"loop": self.name, "failures": self.failures, "error": repr(exc)},
            )
            if isinstance(exc, OperationalError | InterfaceError | DatabaseError):
                # The connection may be broken mid-transaction; start afresh.
                if not connection.in_atomic_block:
                    connection.close()
            return False
        if self.failures:
            logger.info("loop.recovered", extra={"loop": self.name, "failures": self.failures})
        self.failures = 0
        return busy

    def _safe_shutdown(self) -> None:
        try:
            self.on_shutdown()
        except Exception:
            logger.exception("loop.shutdown_failed", extra={"loop": self.name})


class LoopCommand(BaseCommand):
    """A management command that runs one `Loop` until SIGTERM or SIGINT."""

    loop_class: type[Loop]

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Run a single tick and exit.")

    def handle(self, *args: Any, once: bool = False, **options: Any) -> None:
        loop = self.loop_class()
        # One thread, one persistent connection: no pool (the dispatcher's
        # LISTEN must stay on the connection it waits on), named after the
        # loop so pg_stat_activity shows who is who.
        if hasattr(connection, "close_pool"):
            connection.close_pool()
        options = connection.settings_dict.setdefault("OPTIONS", {})
        options.pop("pool", None)
        options["application_name"] = f"taskforge-{loop.name}"
        connection.settings_dict["CONN_MAX_AGE"] = None
        connection.settings_dict["CONN_HEALTH_CHECKS"] = True
        connection.close()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            # Only a flag: the loop notices it between ticks and sleep slices.
            loop.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        code = loop.run(once=once)
        if code:
            raise SystemExit(code)
