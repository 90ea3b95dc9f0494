"""Raw SQL of the workers app, none of it changing a task's status.

Named statements, run by `workers.protocol` and `workers.models`.
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

# -- held tasks --
# For each worker that executes tasks now: how many, and the first ids
# (workers.models.held_tasks).
# Params: worker ids (text[]), how many ids to return per worker.
HELD_TASKS = """
SELECT w.worker_id, c.n, f.first
FROM unnest(%s::text[]) AS w(worker_id)
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM tasks_task t
    WHERE t.status = 'executing' AND t.claimed_by = w.worker_id
) AS c
CROSS JOIN LATERAL (
    SELECT array_agg(s.id::text ORDER BY s.id) AS first FROM (
        SELECT t.id FROM tasks_task t
        WHERE t.status = 'executing' AND t.claimed_by = w.worker_id
        LIMIT %s
    ) AS s
) AS f
WHERE c.n > 0
"""


# -- record_http_attempts --
# What each attempt of a task with an HTTP target got (workers.httptasks.record):
# responses and executions counted up, the last status and the last attempt
# (JSON text), for the attempt still current (attempts = attempt).  Params:
# ids (uuid[]), attempts, responded (0/1), executed (0/1), statuses (int[],
# NULL for none), lasts (text[]), positional.
RECORD_HTTP_ATTEMPTS = """
UPDATE tasks_task t SET http_attempts = jsonb_build_object(
    'response_count', coalesce((t.http_attempts ->> 'response_count')::int, 0) + a.responded,
    'execution_count', coalesce((t.http_attempts ->> 'execution_count')::int, 0) + a.executed,
    'previous_response', a.status,
    'last', a.last::jsonb)
FROM unnest(%s::uuid[], %s::int[], %s::int[], %s::int[], %s::int[], %s::text[])
    AS a(id, attempt, responded, executed, status, last)
WHERE t.id = a.id AND t.attempts = a.attempt
"""

# -- lock_signing_keys --
# Two processes making the first OIDC signing key at once (workers.oidc): the
# table lock decides, the loser reads the winner's key.
LOCK_SIGNING_KEYS = "LOCK TABLE workers_signingkey IN EXCLUSIVE MODE"
