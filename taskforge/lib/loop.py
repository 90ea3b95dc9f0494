"""The shape of every TaskForge loop: a `Loop` with `tick()`, run by a `LoopCommand`.

- `tick()` does one unit of work in its own short transaction(s) and returns
  True when it did work (run again at once) or False (wait `interval`).
- SIGTERM and SIGINT only set `stopping`; the loop finishes its tick, runs
  `on_shutdown()` and the command exits 0.
- An exception is logged at the tick boundary and the loop backs off
  (`backoff()`: doubling, capped at MAX_BACKOFF, jittered) and tries again.
  A Postgres or Redis outage (`taskforge.lib.outages`) is ridden out however
  long it lasts, and work resumes within MAX_BACKOFF of the store answering;
  only other failures (bugs) count towards TASKFORGE_MAX_TICK_FAILURES, the
  crash-loop guard that hands a stuck loop to its supervisor.  A backoff is
  slept in full: a wake-up (NOTIFY) does not cut it short.
- Any number of copies may run at once: every tick claims its rows with
  SKIP LOCKED or compare-and-set, never by assuming it is alone.
"""

from __future__ import annotations

import logging
import random
import signal
import time
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, close_old_connections, connection

from taskforge.conf import conf
from taskforge.lib import outages

logger = logging.getLogger("taskforge.loop")

SLEEP_SLICE = 0.5
# The first retry after BACKOFF_BASE, then doubling up to MAX_BACKOFF: work resumes
# within MAX_BACKOFF (plus a tick) of the store answering again (API.md: 30 s).
BACKOFF_BASE = 0.5
MAX_BACKOFF = 10.0


def backoff(failures: int, rng: random.Random | None = None) -> float:
    """Seconds to wait after `failures` failed ticks in a row (>= 1).

    BACKOFF_BASE doubled per failure up to MAX_BACKOFF, then between half and
    all of it (jitter: the copies of a loop that met one outage do not all
    retry at one instant).  The exponent stops growing once past the cap, so
    any number of failures gives a number (2 ** 1024 is no float).
    """
    exponent = min(max(failures, 1) - 1, 16)
    ceiling = min(MAX_BACKOFF, BACKOFF_BASE * 2.0**exponent)
    return ceiling * (rng or random).uniform(0.5, 1.0)


class Loop:
    """Base class: subclasses set `name` and implement `tick()` and `interval`."""

    name = "loop"

    def __init__(self) -> None:
        self.stopping = False
        self.failures = 0  # failed ticks in a row, outages included
        self.bugs = 0  # of those, the ones that were no outage (the crash-loop guard's)

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
                if limit and self.bugs >= limit:
                    logger.error("loop.giving_up", extra={"loop": self.name, "failures": self.bugs})
                    return 1
                if self.failures:
                    # Loop.wait, not the subclass's: a NOTIFY must not end it early.
                    Loop.wait(self, backoff(self.failures))
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
            outage = outages.is_outage(exc)
            extra = {"loop": self.name, "failures": self.failures, "error": repr(exc)}
            if outage:
                # Expected in an outage, and logged at every retry: no traceback.
                logger.warning("loop.store_unavailable", extra=extra)
            else:
                self.bugs += 1
                logger.exception("loop.tick_failed", extra=extra)
            if outage or isinstance(exc, DatabaseError):
                # The connection may be broken mid-transaction, or on a server that
                # refuses writes (a standby): start afresh on a new one.
                if not connection.in_atomic_block:
                    connection.close()
            return False
        if self.failures:
            logger.info("loop.recovered", extra={"loop": self.name, "failures": self.failures})
        self.failures = 0
        self.bugs = 0
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
