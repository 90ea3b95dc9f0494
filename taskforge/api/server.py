"""The production HTTP server of the API, as `manage.py run_api` starts it.

gunicorn with the project's `gunicorn.conf.py` (threaded workers; bind,
workers and threads from TASKFORGE_BIND, TASKFORGE_WEB_WORKERS and
TASKFORGE_WEB_THREADS).  Stopping, SIGTERM and SIGINT alike drain: the
server stops accepting, waiting long polls answer at once (empty), requests
in flight finish, and the process exits 0 within `graceful_timeout` (10 s).
gunicorn's own SIGINT is a quick stop that drops requests in flight; here
Ctrl-C drains too.  SIGQUIT stays the quick stop.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

from django.conf import settings
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter

CONFIG = Path(settings.BASE_DIR) / "gunicorn.conf.py"


class _Arbiter(Arbiter):  # type: ignore[misc]  # gunicorn ships no annotations
    def handle_int(self) -> None:
        """Ctrl-C drains like SIGTERM."""
        self.handle_term()


class ApiServer(BaseApplication):  # type: ignore[misc]
    """gunicorn, configured from gunicorn.conf.py, serving taskforge.wsgi."""

    def load_config(self) -> None:
        for name, value in runpy.run_path(str(CONFIG)).items():
            if name in self.cfg.settings and value is not None:
                self.cfg.set(name, value)

    def load(self) -> Any:
        from taskforge.wsgi import application

        return application


def serve() -> None:
    """Run the server until it is stopped (blocks; exits the process when done)."""
    _Arbiter(ApiServer()).run()
