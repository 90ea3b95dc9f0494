"""`manage.py createapikey NAME --role producer|worker|admin`: print a new key."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from taskforge.api import keys
from taskforge.api.models import Role
from taskforge.audit.log import CLI


class Command(BaseCommand):
    help = "Create an API key and print it (only its SHA-256 is stored; it cannot be shown again)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Who or what uses the key, for operators.")
        parser.add_argument("--role", required=True, choices=Role.values)

    def handle(self, *args: Any, name: str, role: str, **options: Any) -> None:
        try:
            _, key = keys.issue(name=name, role=role, actor=CLI)
        except keys.InvalidKeyName as exc:
            raise CommandError(exc.message) from exc  # on stderr, exit status 1
        # The key alone on stdout, so scripts can capture it.
        self.stdout.write(key)
