"""DeadCount moves to the dlq app (dlq/migrations/0004_deadcount.py): here it leaves the
state of `tasks`; its table, tasks_deadcount, stays as it is, rows and all."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0013_task_fillfactor"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="DeadCount")],
            database_operations=[],
        ),
    ]
