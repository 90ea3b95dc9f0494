"""`manage.py run_watchdog [--once]`: the watchdog loop (see workers.watchdog)."""

from __future__ import annotations

from taskforge.lib.loop import LoopCommand
from workers.watchdog import WatchdogLoop


class Command(LoopCommand):
    help = "Run the watchdog loop until SIGTERM or SIGINT."
    loop_class = WatchdogLoop
