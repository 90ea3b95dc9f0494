"""taskforge.settings with tests.urls_echo as the URLconf, for a server a test starts
(DJANGO_SETTINGS_MODULE=tests.settings_echo)."""

from __future__ import annotations

from taskforge.settings import *  # noqa: F403

ROOT_URLCONF = "tests.urls_echo"
