"""The API as an RSGI application, as `manage.py run_api` serves it with granian.

See taskforge.api.bridge (what runs where) and taskforge.api.server (settings).
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskforge.settings")

from django.conf import settings

from taskforge import metrics
from taskforge.api.bridge import DjangoBridge
from taskforge.api.server import ServerSettings, prepare_process
from taskforge.wsgi import application as wsgi_application

_server = ServerSettings.from_environ()
application = DjangoBridge(
    wsgi_application,
    threads=_server.threads,
    max_body=settings.TASKFORGE_MAX_REQUEST_BYTES,
    body_timeout=_server.body_timeout,
    hot=wsgi_application.answer,
    on_stop=lambda: metrics.process_exited(os.getpid()),
)
prepare_process()
