"""The base's own SQL: session settings, LISTEN, and the readiness probe.

Named statements, as each app keeps its own in its `sql.py`; nothing outside
these modules writes SQL (tests/test_architecture.py).  A statement with a
`{name}` part (a channel, a setting, a table) is a template for an identifier
that Postgres cannot take as a parameter: its callers fill it with a name of
their own, never with input from outside.
"""

from __future__ import annotations

# The readiness probe (/readyz).
PROBE = "SELECT 1"

# `statement_timeout` (ms, as text) for the rest of the transaction, as SET LOCAL
# does, but with the value as a parameter.  Params: the timeout.
LOCAL_STATEMENT_TIMEOUT = "SELECT set_config('statement_timeout', %s, true)"

# Prepared statements run their generic plans (taskforge.lib.pg._generic_plans).
GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"

# A planner setting for the rest of the transaction, and back (taskforge.lib.pg.planner_off).
SET_LOCAL = "SET LOCAL {name} = {value}"
RESET = "RESET {name}"

# Wake-ups (taskforge.lib.listen): start listening on a channel; stop listening on all.
LISTEN = "LISTEN {channel}"
UNLISTEN_ALL = "UNLISTEN *"
