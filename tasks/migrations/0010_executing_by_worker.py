"""task_executing_by_idx: the tasks each worker executes now, one probe per worker.

GET /workers and the dashboard's worker states ask, for each worker, whether
it holds a task.  With history, that walked the worker's every task through
task_claimed_by_idx, or every executing task through task_executing_hb_idx
(the overview took 24 s with 5 M tasks, 50 k of them executing, and 200
workers).  Built CONCURRENTLY: enqueues, claims and acks go on meanwhile.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks", "0009_smaller_history"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="task",
            index=models.Index(
                condition=models.Q(("status", "executing")),
                fields=["claimed_by"],
                name="task_executing_by_idx",
            ),
        ),
    ]
