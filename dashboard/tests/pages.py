"""What the dashboard's view tests share: the URL prefix, a stand-in id, the flash messages."""

from __future__ import annotations

from typing import Any

D = "/admin/dashboard"
ANY_ID = "0b5e6a2c-8f5d-4b8e-9d0a-6f1f2a3b4c5d"


def flashed(response: Any) -> list[str]:
    """The messages a page shows (django.contrib.messages)."""
    return [str(m) for m in response.context["messages"]]
