"""How tasks_task fills its pages (tasks 0013, docs/operations.md "Storage")."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from queues.tests.factories import QueueFactory
from tasks import transitions

PAGE = 8192


@pytest.mark.django_db
def test_enqueues_leave_a_tenth_of_each_page_to_the_updates_of_its_rows() -> None:
    """Inserts stop at 90 % of a page: the rest holds the rows' next versions
    (a heartbeat is a HOT update only with room on its page), and an enqueue
    never takes the last bytes of a page of long-finished tasks."""
    queue = QueueFactory()
    now = timezone.now()
    transitions.create([transitions.NewTask(queue, {"n": n}, 5, now, 3) for n in range(300)])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (ctid::text::point)[0]::int, count(*), avg(pg_column_size(t.*))"
            " FROM tasks_task t WHERE queue_id = %s GROUP BY 1",
            [queue.pk],
        )
        blocks = cursor.fetchall()
    assert len(blocks) > 2
    fullest = max(rows * (float(size) + 4) for _, rows, size in blocks)  # + line pointer
    row = max(float(size) + 4 for _, _, size in blocks)
    assert fullest <= 0.9 * PAGE, (fullest, blocks)
    assert fullest > 0.9 * PAGE - 2 * row - 24, (fullest, blocks)  # but filled up to there
