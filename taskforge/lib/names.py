"""Strings taken as sent (API.md "Security (v1.2)").

`worker_id` and the names of queues, schedules and API keys are never
trimmed: whitespace at either end, or a control character anywhere, is
refused where the string comes in (400 `invalid` naming the field; exit 1
from a management command), not quietly removed.  " w1\\n" is not "w1".
Queue and schedule names have a stricter pattern of their own
(`queues.models.is_queue_name`), which this rule never contradicts.
"""

from __future__ import annotations

import re

# C0, DEL and C1: Unicode's control characters (category Cc).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

AS_SENT_MESSAGE = "Must not begin or end with whitespace, nor hold control characters."


def as_sent_problem(text: str) -> str | None:
    """Why `text` cannot be taken as sent (AS_SENT_MESSAGE), or None when it can."""
    if text != text.strip() or _CONTROL.search(text) is not None:
        return AS_SENT_MESSAGE
    return None
