"""`python manage.py run_api`: the API's production HTTP server (taskforge.api.server)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Serve the API on TASKFORGE_BIND with the production HTTP server. "
        "SIGTERM or SIGINT drains requests in flight (at most 10 s) and exits 0."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        from taskforge.api.server import serve

        serve()
