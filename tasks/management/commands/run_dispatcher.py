"""`manage.py run_dispatcher [--once]`: the dispatcher loop (see tasks.dispatcher)."""

from __future__ import annotations

from taskforge.lib.loop import LoopCommand
from tasks.dispatcher import DispatcherLoop


class Command(LoopCommand):
    help = "Run the dispatcher loop until SIGTERM or SIGINT."
    loop_class = DispatcherLoop
