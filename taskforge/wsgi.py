"""The WSGI application: Django's handler with the hot lane (taskforge.api.lane)."""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskforge.settings")
django.setup(set_prefix=False)  # before the lane's imports, which need the apps ready

from taskforge.api.lane import ApiWSGIHandler  # noqa: E402

application = ApiWSGIHandler()
