#!/usr/bin/env python3
"""Regenerate the dashboard screenshots in this folder (PNG, 1280x800, plus a phone view).

Runs the screenshot test of dashboard/tests/test_browser.py, which
starts the app on a live test server with a small demo world (test database)
and photographs each page in headless Chromium (/usr/bin/chromium).

    DATABASE_URL=postgres://... REDIS_URL=redis://.../N SECRET_KEY=x \\
        .venv/bin/python docs/screenshots/make_screenshots.py

The Redis db of REDIS_URL is flushed, as by every test run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    env = {**os.environ, "TASKFORGE_SCREENSHOTS": "1"}
    test = "dashboard/tests/test_browser.py::test_screenshots"
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", test], cwd=ROOT, env=env))
