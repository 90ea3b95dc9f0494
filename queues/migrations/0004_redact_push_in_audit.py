# Audit entries keep a queue's push settings redacted (API.md v1.2 "Secrets in push
# settings"): a `queue.create` or `queue.update` entry written before recorded the
# target's header values and its URL's user info and query in clear.  Entries are
# never deleted, so the secrets go from the stored rows, through the one rule
# (`queues.push.redacted`, idempotent).  They cannot come back: the reverse does nothing.

from django.db import migrations
from django.db.models import Q

from queues.push import redacted

BATCH = 500


def _redacted_details(action, details):
    if not isinstance(details, dict):
        return details
    if action == "queue.create" and "push" in details:
        return {**details, "push": redacted(details["push"])}
    changed = details.get("changed")
    if action == "queue.update" and isinstance(changed, dict) and "push" in changed:
        pair = changed["push"]
        pair = [redacted(v) for v in pair] if isinstance(pair, list) else redacted(pair)
        return {**details, "changed": {**changed, "push": pair}}
    return details


def redact(apps, schema_editor):
    AuditEntry = apps.get_model("audit", "AuditEntry")
    ids = list(
        AuditEntry.objects.filter(
            Q(action="queue.create", details__has_key="push")
            | Q(action="queue.update", details__changed__has_key="push")
        )
        .order_by("id")
        .values_list("id", flat=True)
    )
    for start in range(0, len(ids), BATCH):
        entries = list(AuditEntry.objects.filter(id__in=ids[start : start + BATCH]))
        for entry in entries:
            entry.details = _redacted_details(entry.action, entry.details)
        AuditEntry.objects.bulk_update(entries, ["details"])


class Migration(migrations.Migration):
    dependencies = [
        ("queues", "0003_push"),
        ("audit", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(redact, migrations.RunPython.noop),
    ]
