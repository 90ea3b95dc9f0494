"""`manage.py revokeapikey NAME`: revoke the key called NAME in every API process."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from taskforge.api import keys
from taskforge.api.models import ApiKey
from taskforge.audit.log import CLI


class Command(BaseCommand):
    help = (
        "Revoke the API key called NAME (every active key of that name). Within a second "
        "every API process answers 401 to it and ends its long polls."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The name the key was created with.")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        try:
            keys.check_name(name)  # " ci" is not "ci": no key could be named so
        except keys.InvalidKeyName as exc:
            raise CommandError(exc.message) from exc
        if not ApiKey.objects.filter(name=name).exists():
            # CommandError: the message on stderr, exit status 1.
            raise CommandError(f"No API key named {name!r}.")
        count = keys.revoke(ApiKey.objects.filter(name=name), actor=CLI)
        if count:
            self.stdout.write(f"Revoked {count} API key(s) named {name!r}.")
        else:
            self.stdout.write(f"The API key named {name!r} was already revoked.")
