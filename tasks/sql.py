"""Raw SQL of the tasks app: the hot paths, where the ORM would need several round
trips, and the upkeep statements the ORM has no words for (at the end).

Each hot statement moves tasks and writes their events in one round trip: a CTE
locks the rows, updates them guarded by their old status, and inserts one
`tasks_taskevent` row per moved task (but where the task row records the
move: a new task's, and a hand-out's until its outcome row does, tasks.events).
Each is a `Statement` that declares the status edges it takes;
`tasks.transitions` runs them (and nothing else does), and a test holds the
declared edges to `tasks.lifecycle.ALLOWED` and to the events each
statement writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from queues.notify import DISPATCH_CHANNEL, SCHEDULER_CHANNEL
from queues.push import DEFAULT_TIMEOUT_SECONDS
from tasks.lifecycle import Edge

# The lease holder is worker_id *and* the claiming key (API.md v1.1): a guard
# fragment for the statements that act on a held lease (alias t, param key_id;
# a NULL key_id, TaskForge's own callers, and a task claimed with no key
# recorded, are not checked).
HELD_BY_KEY = """(%(key_id)s::bigint IS NULL OR t.claimed_key_id IS NULL
           OR t.claimed_key_id = %(key_id)s::bigint)"""


def by_id_with_status(alias: str, status: str) -> str:
    """The status guard of a row found by its id, in a form no partial index matches.

    Each partial index of tasks_task covers one status (`WHERE status =
    'executing'`, ...).  Written plainly, a guard `status = 'executing'` lets
    the planner scan the executing index whole and join it to the ids, and
    it does so as soon as the statistics say that almost no task is live (a
    server with history): the plan then costs as much as the live set, not
    as the ids given.  Compared under another collation ("C"; equality is
    the same bytes either way) the guard proves no index predicate, so the
    one way to the rows is the primary key, whatever the statistics.
    """
    return f"{alias}.status COLLATE \"C\" = '{status}'"


# The holder guard of rows found by id (alias t, param worker_id), compared
# under "C" for the same reason as `by_id_with_status`: written plainly it
# lets the planner read task_claimed_by_idx, every task the worker ever ran,
# when the statistics make that look cheap.  And wrapped in IS TRUE, since any
# comparison of claimed_by proves that index's predicate (`claimed_by IS NOT
# NULL`) even under "C": then the planner reads that index whole, without a
# bound, when the statistics say few tasks were ever claimed (a fresh table,
# or enqueues ahead of the first workers), and a prepared ack keeps that plan
# while the index grows.
HELD_BY_WORKER = """(t.claimed_by COLLATE "C" = %(worker_id)s) IS TRUE"""


@dataclass(frozen=True, slots=True)
class Statement:
    """One named statement and the status edges (from, to) it may take.

    `off`: boolean planner settings (`enable_sort`, `jit`, ...) its caller
    turns off for it alone (SET LOCAL), where a plan must not follow the
    statistics.
    """

    name: str
    edges: frozenset[Edge]
    text: str
    off: tuple[str, ...] = ()


# Columns of tasks_task selected back into Task instances (tasks.rows.run_statement).
TASK_COLUMNS = """
    t.id, t.queue_id, t.payload, t.status, t.priority, t.scheduled_at, t.claimed_at,
    t.claimed_by, t.claimed_key_id, t.heartbeat_at, t.attempts, t.max_retries, t.last_error,
    t.result,
    t.idempotency_key, t.created_at, t.updated_at, t.status_changed_at, t.finished_at,
    t.name, t.http_request, t.retry_config, t.http_attempts, t.first_claimed_at,
    t.traceparent, t.tracestate, t.fairness_key
"""

# -- create --
# null -> pending for new tasks of one queue.  Rows flagged `buffer` (due now,
# queue not paused) go on to claimed in the same statement, for the caller to
# push to Redis after commit: a fresh task skips the dispatcher's hop.  Neither
# move has an event row: the task row records both (tasks.events).  Other due
# rows wake the dispatchers (NOTIFY, delivered on commit); the earliest task
# due later, if any, wakes the schedulers for its time (`wake_at`, Unix seconds
# as text, or NULL).  Params: queue_id, now, ids (uuid[]), payloads (jsonb as
# text[]), priorities, scheduled (timestamptz[]), max_retries, keys (text[],
# NULL for none), buffer (bool[]), notify (bool), wake_at (text or NULL); and for
# tasks of the Cloud Tasks API names (text[]), http (jsonb as text[]), retry
# (jsonb as text[]), NULL for a native task; traceparents and tracestates (text[],
# or NULL when no task of the call has any: unnest pads a NULL array with NULLs);
# fairness_keys (text[], NULL for the anonymous key).
CREATE = Statement(
    "create",
    frozenset({(None, "pending"), ("pending", "claimed")}),
    f"""
WITH new AS (
    INSERT INTO tasks_task (id, queue_id, payload, status, priority, scheduled_at, attempts,
                            max_retries, idempotency_key, created_at, updated_at,
                            status_changed_at, name, http_request, retry_config, traceparent,
                            tracestate, fairness_key)
    SELECT i.id, %(queue_id)s::uuid, i.payload::jsonb,
           CASE WHEN i.buffer THEN 'claimed' ELSE 'pending' END,
           i.priority, i.scheduled_at, 0, i.max_retries, i.key, %(now)s::timestamptz,
           %(now)s::timestamptz, %(now)s::timestamptz, i.name, i.http::jsonb, i.retry::jsonb,
           i.traceparent, i.tracestate, i.fairness_key
    FROM unnest(%(ids)s::uuid[], %(payloads)s::text[], %(priorities)s::int[],
                %(scheduled)s::timestamptz[], %(max_retries)s::int[], %(keys)s::text[],
                %(buffer)s::bool[], %(names)s::text[], %(http)s::text[], %(retry)s::text[],
                %(traceparents)s::text[], %(tracestates)s::text[], %(fairness_keys)s::text[])
        AS i(id, payload, priority, scheduled_at, max_retries, key, buffer, name, http, retry,
             traceparent, tracestate, fairness_key)
)
SELECT pg_notify('{DISPATCH_CHANNEL}', %(queue_id)s::text) WHERE %(notify)s
UNION ALL
SELECT pg_notify('{SCHEDULER_CHANNEL}', %(wake_at)s::text) WHERE %(wake_at)s::text IS NOT NULL
""",  # nosec B608
)

# -- buffer_due --
# pending -> claimed for one batch of a queue's due tasks, in hand-out order
# (task_pending_due_idx), skipping rows other dispatchers hold; only those
# scoring below better_than (tasks.buffer.score) when it is given.  Params:
# queue_id, now, limit, better_than (bigint or NULL).  Each row says whether
# its task has an HTTP target (the Cloud Tasks API's): those go to the queue's
# push lane of the buffer (tasks.buffer.HTTP_LANE).  Run with sorting off:
# allowed to sort, the planner reads every pending task of the queue through
# task_not_done_idx and sorts them as soon as the statistics say the queue
# holds fewer than `limit` (they say so on a server with history), a cost
# that grows with the backlog instead of with the limit.
BUFFER_DUE = Statement(
    "buffer_due",
    frozenset({("pending", "claimed")}),
    f"""
WITH picked AS (
    SELECT id, status_changed_at FROM tasks_task
    WHERE queue_id = %(queue_id)s AND status = 'pending' AND scheduled_at <= %(now)s
      AND fairness_key IS NULL
      AND (%(better_than)s::bigint IS NULL
           OR priority::bigint * 10000000000000
              + floor(extract(epoch FROM scheduled_at) * 1000)::bigint < %(better_than)s::bigint)
    ORDER BY priority, scheduled_at, id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), moved AS (
    UPDATE tasks_task t
    SET status = 'claimed', updated_at = %(now)s, status_changed_at = %(now)s
    FROM picked
    WHERE t.id = picked.id AND {by_id_with_status("t", "pending")}
    RETURNING t.id, t.priority, t.scheduled_at, t.attempts,
              picked.status_changed_at AS previous_changed_at,
              t.http_request IS NOT NULL AS http
), events AS (
    INSERT INTO tasks_taskevent (task_id, at, from_status, to_status, attempt)
    SELECT id, %(now)s, 'pending', 'claimed', attempts FROM moved
)
SELECT id, priority, scheduled_at, attempts, previous_changed_at, http, NULL::text FROM moved
ORDER BY priority, scheduled_at, id
""",  # nosec B608 - constants only; values are bound parameters
    # jit too: a plan with sorting off carries its huge cost, which would
    # otherwise buy it a JIT compilation (hundreds of ms) on every call.  Hash
    # and merge joins too: the statement is prepared, and its generic plan made
    # while the table is small joins the picked rows to a read of the whole
    # table, which it keeps as the table grows; with only nested loops left, the
    # picked rows are found through the primary key whatever the size.
    off=("enable_sort", "jit", "enable_hashjoin", "enable_mergejoin"),
)

# -- buffer_due_keys --
# The same move for tasks with a fairness key (tasks.buffer: each key's own
# ready set, bounded like the queue's): per key given, up to its `room` of its
# due tasks in hand-out order (task_pending_key_idx).  Params: queue_id, now,
# keys (text[]), rooms (int[]).
BUFFER_DUE_KEYS = Statement(
    "buffer_due",  # the verb's keyed form (transitions.buffer_due with rooms)
    frozenset({("pending", "claimed")}),
    f"""
WITH want AS (
    SELECT * FROM unnest(%(keys)s::text[], %(rooms)s::int[]) AS w(key, room)
), picked AS (
    SELECT p.id, p.status_changed_at FROM want CROSS JOIN LATERAL (
        SELECT id, status_changed_at FROM tasks_task
        WHERE queue_id = %(queue_id)s AND status = 'pending' AND fairness_key = want.key
          AND scheduled_at <= %(now)s
        ORDER BY priority, scheduled_at, id
        LIMIT want.room
        FOR NO KEY UPDATE SKIP LOCKED
    ) p
), moved AS (
    UPDATE tasks_task t
    SET status = 'claimed', updated_at = %(now)s, status_changed_at = %(now)s
    FROM picked
    WHERE t.id = picked.id AND {by_id_with_status("t", "pending")}
    RETURNING t.id, t.priority, t.scheduled_at, t.attempts,
              picked.status_changed_at AS previous_changed_at,
              t.http_request IS NOT NULL AS http, t.fairness_key
), events AS (
    INSERT INTO tasks_taskevent (task_id, at, from_status, to_status, attempt)
    SELECT id, %(now)s, 'pending', 'claimed', attempts FROM moved
)
SELECT id, priority, scheduled_at, attempts, previous_changed_at, http, fairness_key FROM moved
""",  # nosec B608 - constants only; values are bound parameters
    off=("jit", "enable_hashjoin", "enable_mergejoin"),
)

# -- pending_keys --
# The fairness keys with pending tasks in a queue, after `after` in key order,
# at most `limit`: a skip scan of task_pending_key_idx (one probe per key, not
# per task).  Params: queue_id, after (text), limit.
PENDING_KEYS = """
WITH RECURSIVE k(key) AS (
    (SELECT fairness_key FROM tasks_task
     WHERE queue_id = %(queue_id)s AND status = 'pending' AND fairness_key IS NOT NULL
       AND fairness_key > %(after)s
     ORDER BY fairness_key LIMIT 1)
    UNION ALL
    SELECT (SELECT fairness_key FROM tasks_task
            WHERE queue_id = %(queue_id)s AND status = 'pending' AND fairness_key IS NOT NULL
              AND fairness_key > k.key
            ORDER BY fairness_key LIMIT 1)
    FROM k WHERE k.key IS NOT NULL
)
SELECT key FROM k WHERE key IS NOT NULL LIMIT %(limit)s
"""

# -- hand_out --
# claimed -> executing for the ids a claim popped from the buffer, with no
# event row: the task row records the claim (claimed_at, claimed_by,
# attempts) until the attempt's outcome, whose event row then records it
# (tasks.events).  Ids no
# longer `claimed` (cancelled, or handed out through a duplicate buffer
# entry) are skipped: the status guard is the fence; so are ids of a queue
# paused meanwhile, or whose delivery changed meanwhile (a push queue's
# tasks go to push processes only, a pulled queue's to claims only; the
# caller puts those back).  Params: ids (uuid[]), worker_id, key_id (the
# claiming API key's pk, or NULL), now, push (the caller is a push process).
#
# The lease runs the heartbeat timeout from `now`, and for a push process,
# which does not heartbeat, from the target's timeout_seconds later.  Each
# row returns its queue's push target as this statement read it
# (`push_target`, JSON text; NULL for a claim): a push process sends the task
# there, so a change of target committed before the hand-out applies to it
# (API.md: "applies to tasks not yet handed out"), and the lease matches it.
#
# Its transaction commits without waiting for its WAL to reach the disk
# (synchronous_commit off for it alone, read at commit): a hand-out lost in a
# Postgres crash leaves the task `claimed`, and it is handed out again (the
# buffer's reconcile), as when a worker dies: at-least-once holds, and the
# worker's ack of the lost attempt answers 409 lease_lost.  The claim answers
# a flush sooner.  Every other move waits for its flush; the worker's next
# call (heartbeat, ack) flushes the hand-out with its own.
HAND_OUT = Statement(
    "hand_out",
    frozenset({("claimed", "executing")}),
    f"""
WITH no_flush_wait AS (
    SELECT set_config('synchronous_commit', 'off', true)
), cur AS (
    SELECT tasks_task.id, tasks_task.status_changed_at, q.push
    FROM tasks_task JOIN queues_queue q ON q.id = tasks_task.queue_id
    WHERE tasks_task.id = ANY(%(ids)s::uuid[]) AND {by_id_with_status("tasks_task", "claimed")}
      -- A task with an HTTP target goes to push processes only, whatever its queue.
      AND CASE WHEN tasks_task.http_request IS NOT NULL THEN %(push)s::boolean
               ELSE (q.push IS NOT NULL) = %(push)s::boolean END
      -- A RunTask's task (`run`: popped from the run lane) goes even from a paused queue.
      AND (NOT q.paused OR %(run)s::boolean)
    ORDER BY tasks_task.id
    FOR NO KEY UPDATE OF tasks_task
), moved AS (
    UPDATE tasks_task t
    SET status = 'executing', attempts = t.attempts + 1, claimed_by = %(worker_id)s,
        claimed_key_id = %(key_id)s,
        claimed_at = %(now)s, updated_at = %(now)s, status_changed_at = %(now)s,
        first_claimed_at = coalesce(t.first_claimed_at, %(now)s),
        -- A task with an HTTP target is leased for its own dispatch deadline.
        heartbeat_at = %(now)s::timestamptz + make_interval(secs => CASE
            WHEN t.http_request IS NOT NULL
            THEN (t.http_request->>'dispatch_deadline_seconds')::float8
            WHEN %(push)s::boolean
            THEN coalesce((cur.push->>'timeout_seconds')::int, {DEFAULT_TIMEOUT_SECONDS})
            ELSE 0 END)
    FROM cur
    WHERE t.id = cur.id AND {by_id_with_status("t", "claimed")}
    RETURNING {TASK_COLUMNS}, cur.status_changed_at AS previous_changed_at,
        cur.push::text AS push_target
)
SELECT moved.* FROM moved, no_flush_wait
""",  # nosec B608
)


# -- ack --
# executing -> done for the items of one worker, each guarded by holder and,
# when given, attempt, and by the claiming key when key_id is given (a task
# claimed with no key recorded accepts any).  Params: worker_id, key_id, now,
# ids (uuid[]), attempts
# (int[], NULL for "any"), results (jsonb[] as text[]; NULL for none).
def _ack(answer: str) -> str:
    return f"""
WITH items AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(attempts)s::int[], %(results)s::text[])
        AS i(id, attempt, result)
), cur AS (
    SELECT t.id, t.status_changed_at, i.result FROM tasks_task t JOIN items i ON i.id = t.id
    WHERE {by_id_with_status("t", "executing")} AND {HELD_BY_WORKER}
      AND {HELD_BY_KEY}
      AND (i.attempt IS NULL OR t.attempts = i.attempt)
    ORDER BY t.id
    FOR NO KEY UPDATE OF t
), moved AS (
    UPDATE tasks_task t
    SET status = 'done', result = cur.result::jsonb, finished_at = %(now)s,
        updated_at = %(now)s, status_changed_at = %(now)s
    FROM cur
    WHERE t.id = cur.id AND {by_id_with_status("t", "executing")}
    RETURNING {TASK_COLUMNS}, cur.status_changed_at AS previous_changed_at
), events AS (
    INSERT INTO tasks_taskevent (task_id, queue_id, at, from_status, to_status, worker_id, attempt,
                                 claimed_at)
    SELECT id, queue_id, %(now)s, 'executing', 'done', %(worker_id)s, attempts, claimed_at
    FROM moved
)
SELECT {answer} FROM moved
"""  # nosec B608


ACK = Statement("ack", frozenset({("executing", "done")}), _ack("*"))
# The same move answering only what its log lines, its spans (taskforge.tracing)
# and an ack batch's answer read (the rest of each Task is deferred): a batch's
# payloads and results are neither sent back nor decoded.
ACK_BRIEF_TEXT = _ack(
    "id, queue_id, status, attempts, previous_changed_at, traceparent, first_claimed_at"
)

# -- next_due --
# When the scheduler next has work: the earliest retry (task_retry_due_idx),
# the earliest delayed pending task after `since` (task_pending_sched_idx) and
# the earliest running schedule (schedule_due_idx), each one index probe.
# The scheduler sleeps until the earliest of them (tasks.scheduler).
# Params: since.
NEXT_DUE = """
SELECT
    (SELECT min(scheduled_at) FROM tasks_task WHERE status = 'retry'),
    (SELECT min(scheduled_at) FROM tasks_task
     WHERE status = 'pending' AND scheduled_at > %(since)s),
    (SELECT min(next_run_at) FROM tasks_schedule WHERE NOT paused)
"""


# -- upkeep (tasks.vacuum) --
# Postgres's counts of the rows of each table.  Params: tables (text[]).
TABLE_COUNTS = """
SELECT relname, n_live_tup, n_dead_tup, n_mod_since_analyze FROM pg_stat_user_tables
WHERE relname = ANY(%(tables)s) ORDER BY relname
"""
# One table of tasks.vacuum.TABLES; outside a transaction.
VACUUM_ANALYZE = "VACUUM (SKIP_LOCKED, ANALYZE) {table}"
VACUUM = "VACUUM (SKIP_LOCKED) {table}"
ANALYZE = "ANALYZE (SKIP_LOCKED) {table}"


# -- take_name --
# A named task's ID (tasks.names.take): the row of (queue, name), inserted
# unless one exists; RETURNING says whether it was.  Params: queue_id, name,
# task_id (positional).
TAKE_NAME = """
INSERT INTO tasks_taskname (queue_id, name, task_id) VALUES (%s, %s, %s)
ON CONFLICT (queue_id, name) DO NOTHING
RETURNING id
"""

# -- forget_names --
# Before tasks are deleted (tasks.names.forget): each one's finished_at kept on
# the row of its name, which outlives it.  Params: task ids (uuid[]).
FORGET_NAMES = """
UPDATE tasks_taskname n SET released_at = t.finished_at
FROM tasks_task t WHERE t.id = ANY(%s::uuid[]) AND n.task_id = t.id
"""


# -- keys (tasks.stats) --
# Per fairness key of a queue with tasks on their way (pending, claimed,
# executing, retry): `pending` (due pending and claimed), `executing`, `retry`
# and the oldest due pending or claimed task's scheduled_at; the anonymous key
# as NULL.  KEYS_PAGE: in the keys' code point order (COLLATE "C"), the
# anonymous key first, after the cursor (`started`: the anonymous key was
# shown; `after`: the last key shown, NULL for none), those with pending >=
# min_pending, at most `limit`.  TOP_KEYS: the `limit` keys with the most
# pending.  Params: queue_id, now, and those named.
_KEY_ROWS = """
SELECT fairness_key,
       count(*) FILTER (WHERE status IN ('pending', 'claimed') AND scheduled_at <= %(now)s),
       count(*) FILTER (WHERE status = 'executing'),
       count(*) FILTER (WHERE status = 'retry'),
       min(scheduled_at) FILTER (WHERE status IN ('pending', 'claimed')
                                   AND scheduled_at <= %(now)s)
FROM tasks_task
WHERE queue_id = %(queue_id)s AND status IN ('pending', 'claimed', 'executing', 'retry')
"""
KEYS_PAGE = (
    _KEY_ROWS
    + """
  AND (NOT %(started)s::boolean
       OR (fairness_key IS NOT NULL
           AND (%(after)s::text IS NULL OR fairness_key COLLATE "C" > %(after)s::text)))
GROUP BY fairness_key
HAVING count(*) FILTER (WHERE status IN ('pending', 'claimed') AND scheduled_at <= %(now)s)
       >= %(min_pending)s
ORDER BY fairness_key COLLATE "C" NULLS FIRST
LIMIT %(limit)s
"""
)
TOP_KEYS = (
    _KEY_ROWS
    + """
GROUP BY fairness_key
ORDER BY 2 DESC, 3 DESC, fairness_key COLLATE "C" NULLS FIRST
LIMIT %(limit)s
"""
)


# -- recent key hand-outs (tasks.reconcile.restore_key_rates) --
# Per fairness key of a queue, the hand-outs since `since`: tasks executing
# that were handed out since then (task_executing_since_idx) and attempts that
# ended since then and had begun since then (taskevent_outcome_idx).  What a
# key's bucket holds again after Redis lost it.  Params: queue_id, since.
RECENT_KEY_HANDOUTS = """
SELECT t.fairness_key, count(*) FROM (
    SELECT id FROM tasks_task
    WHERE status = 'executing' AND claimed_at IS NOT NULL AND claimed_at > %(since)s
      AND queue_id = %(queue_id)s
    UNION ALL
    SELECT task_id FROM tasks_taskevent
    WHERE queue_id = %(queue_id)s AND from_status = 'executing' AND at > %(since)s
      AND claimed_at > %(since)s
) h JOIN tasks_task t ON t.id = h.id
WHERE t.fairness_key IS NOT NULL
GROUP BY t.fairness_key
"""
