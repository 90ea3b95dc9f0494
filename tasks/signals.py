"""Signals sent by `tasks.transitions` inside the transaction of the move.

Apps above `tasks` keep their own records of a move through these, so the
transitions never import them: `dlq` keeps its entries this way.  A receiver
runs in the mover's transaction; what it writes stands or falls with the move.
Receivers must not do slow work (no network calls): the rows are locked.
"""

from __future__ import annotations

from django.dispatch import Signal

# executing -> dead.  kwargs: tasks (the moved Tasks, status dead), error, now.
dead_lettered = Signal()

# dead -> pending.  kwargs: tasks (the moved Tasks, status pending), now.
replayed = Signal()
