"""Where the examples find TaskForge: the URL and an API key.

- URL: `TASKFORGE_URL`, default `http://localhost:8080` (what `make run` serves).
- Key: `TASKFORGE_API_KEY`, else the admin key `make run` saved in
  `.taskforge/admin_api_key` at the root of the checkout.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEY_FILE = ROOT / ".taskforge" / "admin_api_key"


def url() -> str:
    return os.environ.get("TASKFORGE_URL", "http://localhost:8080")


def api_key() -> str:
    key = os.environ.get("TASKFORGE_API_KEY", "").strip()
    if key:
        return key
    try:
        return KEY_FILE.read_text().strip()
    except FileNotFoundError:
        sys.exit(
            f"No API key: set TASKFORGE_API_KEY or start `make run` once (it writes {KEY_FILE})."
        )
