"""`manage.py run_scheduler [--once]`: the scheduler loop (see tasks.scheduler)."""

from __future__ import annotations

from taskforge.lib.loop import LoopCommand
from tasks.scheduler import SchedulerLoop


class Command(LoopCommand):
    help = "Run the scheduler loop until SIGTERM or SIGINT."
    loop_class = SchedulerLoop
