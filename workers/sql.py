"""Raw SQL of the worker protocol that changes no task status.

Named statements, run only by `workers.protocol`.
"""

from __future__ import annotations

from tasks.sql import HELD_BY_KEY, HELD_BY_WORKER, by_id_with_status

# -- heartbeat --
# Extend the lease of tasks the worker holds (worker id and, when key_id is
# given, the claiming key).  Params: worker_id, key_id, now, ids (uuid[]),
# attempts (int[], NULL for "any").
HEARTBEAT = f"""
WITH items AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(attempts)s::int[]) AS i(id, attempt)
)
UPDATE tasks_task t SET heartbeat_at = %(now)s
FROM items i
WHERE t.id = i.id AND {by_id_with_status("t", "executing")} AND {HELD_BY_WORKER}
  AND {HELD_BY_KEY}
  AND (i.attempt IS NULL OR t.attempts = i.attempt)
RETURNING t.id, t.heartbeat_at
"""  # nosec B608

# -- seen --
# Upsert the worker's last_seen_at, at most once a second per worker.
WORKER_SEEN = """
INSERT INTO workers_worker (worker_id, last_seen_at) VALUES (%(worker_id)s, %(now)s)
ON CONFLICT (worker_id) DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at
WHERE workers_worker.last_seen_at < EXCLUDED.last_seen_at - interval '1 second'
"""
