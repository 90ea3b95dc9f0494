"""Issuing and revoking API keys, each with its audit entry.

`createapikey` and the Django admin act through these; `ApiKey.issue` alone
writes no audit entry.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import QuerySet

from taskforge.api import revocation
from taskforge.api.models import ApiKey
from taskforge.audit.log import Actor, record
from taskforge.audit.models import Action
from taskforge.errors import TaskForgeError
from taskforge.lib import names


class InvalidKeyName(TaskForgeError):
    """Not a name an API key can have."""

    code = "invalid"
    status_code = 400


def check_name(name: str) -> None:
    """Raises InvalidKeyName unless `name` can be a key's name as given (never trimmed)."""
    problem = names.as_sent_problem(name)
    if problem is not None:
        raise InvalidKeyName(f"API key name {name!r}: {problem}")


def issue(name: str, role: str, *, actor: Actor) -> tuple[ApiKey, str]:
    """Create a key; return the row and the key itself, which is never stored.

    Raises:
        InvalidKeyName: whitespace at either end of `name`, or a control character.
    """
    check_name(name)
    with transaction.atomic():
        api_key, key = ApiKey.issue(name=name, role=role)
        record(
            actor,
            Action.APIKEY_CREATE,
            target=api_key.name,
            details={"id": api_key.pk, "role": api_key.role},
        )
    return api_key, key


def revoke(keys: QuerySet[ApiKey], *, actor: Actor) -> int:
    """Revoke the keys not revoked yet among `keys`, one audit entry each; return how many.

    The change commits, then every API process hears of it
    (taskforge.api.revocation): within a second each answers 401 to those
    keys and ends their long polls.
    """
    with transaction.atomic():
        # Lock order: by id, so two revocations of overlapping sets cannot deadlock.
        active = list(keys.filter(revoked=False).select_for_update().order_by("id"))
        ApiKey.objects.filter(pk__in=[key.pk for key in active]).update(revoked=True)
        for key in active:
            record(
                actor,
                Action.APIKEY_REVOKE,
                target=key.name,
                details={"id": key.pk, "role": key.role},
            )
            revocation.publish_on_commit(revocation.key_topic(key.pk))
    return len(active)
