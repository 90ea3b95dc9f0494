"""The DLQ's SQL: named statements, run only by `dlq.depth`."""

from __future__ import annotations

# -- compact --
# Fold each queue's depth rows into one (none for a queue at 0), at most
# `batch` rows a statement; SKIP LOCKED, so folds running at once never wait.
# Returns the number of rows folded.  Params: batch.
COMPACT = """
WITH gone AS (
    DELETE FROM tasks_deadcount
    WHERE id IN (
        SELECT id FROM tasks_deadcount
        WHERE queue_id IN (
            SELECT queue_id FROM tasks_deadcount GROUP BY queue_id HAVING count(*) > 1
        )
        ORDER BY id
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING queue_id, dead
), folded AS (
    INSERT INTO tasks_deadcount (queue_id, dead)
    SELECT queue_id, sum(dead) FROM gone GROUP BY queue_id HAVING sum(dead) <> 0
)
SELECT count(*) FROM gone
"""

# -- reconcile --
# Set every depth right from the dead tasks themselves, in one statement (one
# snapshot); returns each correction (queue_id, delta).
RECONCILE = """
INSERT INTO tasks_deadcount (queue_id, dead)
SELECT queue_id, actual - counted FROM (
    SELECT coalesce(t.queue_id, c.queue_id) AS queue_id,
           coalesce(t.n, 0) AS actual, coalesce(c.n, 0) AS counted
    FROM (SELECT queue_id, count(*) AS n FROM tasks_task WHERE status = 'dead'
          GROUP BY queue_id) t
    FULL JOIN (SELECT queue_id, sum(dead) AS n FROM tasks_deadcount GROUP BY queue_id) c
        ON c.queue_id = t.queue_id
) d
WHERE actual <> counted
RETURNING queue_id, dead
"""
