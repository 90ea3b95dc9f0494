"""The task lifecycle: every status, every allowed move, and the sets derived from them.

API.md, "Task status":

    (new) ─> pending ─> claimed ─> executing ─> done
               ^  │        │           ├──────> retry ─> pending (when due)
               │  │        └─> pending └──────> dead ──> pending (replay)
               │  └──────> cancelled  (also from claimed and retry)

`ALLOWED` is the one table of moves.  `tasks.transitions` implements each
move once (its verbs and the statements of `tasks.sql` declare the edges they
take; a test holds them to this table), and the sets below are read by the
API, the dashboard and the admin alike, so no view restates a rule.
"""

from __future__ import annotations

from django.db import models


class TaskStatus(models.TextChoices):
    PENDING = "pending"
    CLAIMED = "claimed"
    EXECUTING = "executing"
    RETRY = "retry"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"


S = TaskStatus

# A move: (from, to); `from` is None for the creation of a task.
Edge = tuple[str | None, str]

ALLOWED: dict[str | None, frozenset[str]] = {
    None: frozenset({S.PENDING}),
    S.PENDING: frozenset({S.CLAIMED, S.CANCELLED}),
    S.CLAIMED: frozenset({S.EXECUTING, S.PENDING, S.CANCELLED}),
    # executing -> cancelled: a Cloud Tasks DeleteTask of a task whose attempt is
    # in flight (API-cloudtasks.md); its answer is then discarded.
    S.EXECUTING: frozenset({S.DONE, S.RETRY, S.DEAD, S.CANCELLED}),
    S.RETRY: frozenset({S.PENDING, S.CANCELLED}),
    S.DEAD: frozenset({S.PENDING}),
    S.DONE: frozenset(),
    S.CANCELLED: frozenset(),
}

EDGES: frozenset[Edge] = frozenset(
    (from_status, to_status) for from_status, targets in ALLOWED.items() for to_status in targets
)


def is_allowed(from_status: str | None, to_status: str) -> bool:
    return to_status in ALLOWED.get(from_status, frozenset())


# The moves a new task's row records instead of event rows (tasks.events): its
# creation, and the enqueue's move into the dispatch buffer, at its creation.
ROW_RECORDED: tuple[Edge, ...] = ((None, S.PENDING), (S.PENDING, S.CLAIMED))


# The hand-out of an attempt, which the event row of the attempt's outcome
# records (and the task row until then), not a row of its own (tasks.events).
CLAIM: Edge = (S.CLAIMED, S.EXECUTING)


def moves_of_row(status: str, first_move: Edge | None) -> list[Edge]:
    """The moves of ROW_RECORDED a task's row records: from its status and the
    first move of the rest of its chain (None when it has none), oldest first.

    A task created `pending` leaves `pending` first, so a task whose first
    later move leaves `claimed` (or, with none yet, is `claimed`) was buffered
    by its enqueue.  A first stored move from nothing was written by an earlier
    version, which stored every move: the row records none.
    """
    if first_move is not None and first_move[0] is None:
        return []
    if (first_move[0] if first_move is not None else status) == S.CLAIMED:
        return list(ROW_RECORDED)
    return list(ROW_RECORDED[:1])


# The sets are tuples in declaration order, so a query built from one reads
# the same in every process.

# Finished for good: no move leads out (done, cancelled).
FINISHED: tuple[str, ...] = tuple(s for s in S.values if not ALLOWED[s])

# Everything not finished.  A queue with a live task cannot be deleted (API.md,
# DELETE /queues/:name), and queue statistics count only these.
LIVE: tuple[str, ...] = tuple(s for s in S.values if s not in FINISHED)

# Still on its way without an operator (dead waits for a replay): the
# dashboard watches a task in one of these for its next move.
IN_PROGRESS: tuple[str, ...] = tuple(s for s in LIVE if s != S.DEAD)

# What a producer or an operator may cancel (DELETE /queues/:name/tasks/:id, purge):
# not an executing task, whose attempt only a Cloud Tasks DeleteTask cuts short.
CANCELLABLE: tuple[str, ...] = tuple(
    s for s in S.values if is_allowed(s, S.CANCELLED) and s != S.EXECUTING
)
