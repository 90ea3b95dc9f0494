"""`manage.py run_pusher [--once]`: deliver push queues' tasks to their targets (workers.pusher)."""

from __future__ import annotations

from taskforge.lib.loop import LoopCommand
from workers.pusher import PushLoop


class Command(LoopCommand):
    help = "Run a push process (POSTs push queues' tasks to their URLs) until SIGTERM or SIGINT."
    loop_class = PushLoop
