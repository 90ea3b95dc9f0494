"""The queues app's SQL: named statements, run only by `queues.notify`."""

from __future__ import annotations

# -- notify --
# Wake whoever LISTENs on a channel, once the transaction commits.  Params:
# channel, payload (text).
NOTIFY = "SELECT pg_notify(%(channel)s, %(payload)s)"
