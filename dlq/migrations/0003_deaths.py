"""DeadLetterTask.deaths: whether an entry's task is dead now, read from the entry.

`dead_now()` was a join with the tasks (status `dead`), and the planner read
every dead task of every queue for a page of one queue's DLQ.  An entry's task
is dead now when it died more often than it was replayed.  The column arrives
with its default (1: one death) without rewriting the table; only entries of
replayed tasks need their count, from their task's status now.
"""

from django.db import migrations, models

SET_REPLAYED = """
UPDATE dlq_deadlettertask d
SET deaths = d.replay_count + CASE WHEN t.status = 'dead' THEN 1 ELSE 0 END
FROM tasks_task t
WHERE t.id = d.task_id AND d.replay_count > 0
"""


class Migration(migrations.Migration):
    dependencies = [
        ("dlq", "0002_dlq_index_with_task"),
    ]

    operations = [
        migrations.AddField(
            model_name="deadlettertask",
            name="deaths",
            field=models.PositiveIntegerField(default=1),
        ),
        migrations.RunSQL(SET_REPLAYED, migrations.RunSQL.noop),
    ]
