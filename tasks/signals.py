"""Signals sent by `tasks` to the apps above it, which `tasks` may not import.

Most are sent by `tasks.transitions` inside the transaction of the move.
Apps above `tasks` keep their own records of a move through these, so the
transitions never import them: `dlq` keeps its entries and each queue's DLQ
depth this way.  A receiver runs in the mover's transaction; what it writes
stands or falls with the move.  Receivers must not do slow work (no network
calls): the rows are locked.
"""

from __future__ import annotations

from django.dispatch import Signal

# executing -> dead.  kwargs: tasks (the moved Tasks, status dead), error, now.
dead_lettered = Signal()

# dead -> pending.  kwargs: tasks (the moved Tasks, status pending), now.
replayed = Signal()

# Dead tasks deleted for good (a discard, retention), inside the delete's
# transaction.  kwargs: dead ({queue id: how many}, none zero).
dead_deleted = Signal()

# Each round of the watchdog (workers.watchdog), outside any transaction: apps
# above tasks tidy their records (the DLQ folds its depth rows).  No kwargs.
upkeep = Signal()

# Asked by tasks.stats for the DLQ depth of queues, which the DLQ keeps; the
# receiver returns {queue id: depth}.  kwargs: queue_ids (a list).
dlq_depths = Signal()
