"""Settings for static type checking only: never used to serve or test.

The type checker's Django plugin imports the settings to learn the installed apps and
models. `taskforge.settings` requires SECRET_KEY and DATABASE_URL, so this module fills
placeholders in for them (nothing connects at import) and keeps every other value as is.
"""

from __future__ import annotations

import os

os.environ.setdefault("SECRET_KEY", "type-checking-only")
os.environ.setdefault("DATABASE_URL", "postgres://localhost/taskforge")

from taskforge.settings import *  # noqa: F403
