# The two groups of API.md v1.1 for people, and the permissions of the
# operator actions they are made of (dashboard.roles uses the same names).

from django.contrib.auth.management import create_permissions
from django.db import migrations, models

VIEW = [
    ("queues", "view_queue"),
    ("tasks", "view_task"),
    ("tasks", "view_taskevent"),
    ("dlq", "view_deadlettertask"),
    ("workers", "view_worker"),
    ("api", "view_apikey"),
    ("audit", "view_auditentry"),
]
OPERATE = [
    ("dashboard", "pause_queue"),
    ("dashboard", "purge_queue"),
    ("dashboard", "cancel_task"),
    ("dashboard", "replay_task"),
    ("dashboard", "discard_task"),
]
GROUPS = {"TaskForge viewers": VIEW, "TaskForge operators": VIEW + OPERATE}


def create_groups(apps, schema_editor):
    # Permissions are created after `migrate` (post_migrate); the groups need
    # them now, so create those of every app as they stand at this migration.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, permissions in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set(
            [
                Permission.objects.get(content_type__app_label=app_label, codename=codename)
                for app_label, codename in permissions
            ]
        )


def remove_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=list(GROUPS)).delete()


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("api", "0001_initial"),
        ("audit", "0001_initial"),
        ("dlq", "0001_initial"),
        ("queues", "0001_initial"),
        ("tasks", "0001_initial"),
        ("workers", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name='Operation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
            ],
            options={
                'verbose_name': 'operator action',
                'permissions': [('pause_queue', 'Can pause and resume queues'), ('purge_queue', 'Can purge queues'), ('cancel_task', 'Can cancel tasks'), ('replay_task', 'Can replay dead tasks'), ('discard_task', 'Can discard dead tasks')],
                'managed': False,
                'default_permissions': (),
            },
        ),
        migrations.RunPython(create_groups, remove_groups),
    ]
