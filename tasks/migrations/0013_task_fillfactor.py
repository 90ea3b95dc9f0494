"""tasks_task keeps a tenth of each page free for the updates of its rows.

Inserts (enqueues) stop filling a page at 90 %; the rest is for the new row
versions of a task's moves and heartbeats on the same page (a heartbeat is a
HOT update only when its page has room).  And an insert no longer takes the
last few hundred bytes of a page whose rows are long finished: with every
page of a table of history holding such a remnant, a batch of enqueues wrote
one row into each of a hundred thousand old pages, a full-page image each,
and ran at 0.62-0.84x its speed on an empty table (docs/operations.md).
Applies to pages written from now on; nothing is rewritten, and the table
is locked for an instant.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0012_claim_in_outcome"),
    ]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE tasks_task SET (fillfactor = 90)",
            reverse_sql="ALTER TABLE tasks_task RESET (fillfactor)",
        ),
    ]
