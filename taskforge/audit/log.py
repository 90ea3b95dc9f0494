"""Writing the audit log: who (`Actor`) did what (`record`).

The services that perform operator actions take an `actor` and call `record`
inside the transaction of the action, so an entry exists exactly when the
action committed.  The API, the dashboard and the admin pass `of_request(request)`;
management commands pass `CLI`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connection

from taskforge.audit.models import Action, ActorKind, AuditEntry


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts: an API key (by name), a signed-in user (by user name), or the CLI."""

    kind: ActorKind
    name: str

    @classmethod
    def api_key(cls, name: str) -> Actor:
        return cls(ActorKind.API_KEY, name)

    @classmethod
    def user(cls, name: str) -> Actor:
        return cls(ActorKind.USER, name)


# Every management command acts as this one actor (API.md: `{"kind": "cli", "name": "manage.py"}`).
CLI = Actor(ActorKind.CLI, "manage.py")


def of_request(request: Any) -> Actor:
    """The actor behind a request: its API key (a DRF request of the API) or
    its signed-in user (the dashboard and Django admin).

    Raises:
        ValueError: the request has neither (a view that acts must require one).
    """
    user = getattr(request, "user", None)
    # An API key's principal names its own actor (taskforge.api.authentication).
    actor = getattr(user, "audit_actor", None)
    if isinstance(actor, Actor):
        return actor
    if user is not None and user.is_authenticated:
        return Actor.user(user.get_username())
    raise ValueError("an operator action needs an API key or a signed-in user")


def record(
    actor: Actor,
    action: Action,
    *,
    queue: str | None = None,
    target: str | None = None,
    details: dict[str, Any] | None = None,
) -> AuditEntry:
    """Write one audit entry.

    Caller contract: inside the transaction of the action it records
    (atomic()), so the entry commits or rolls back with the action.

    Raises:
        RuntimeError: called outside a transaction.
    """
    _require_transaction()
    return AuditEntry.objects.create(
        actor_kind=actor.kind,
        actor_name=actor.name,
        action=action,
        queue=queue,
        target=target,
        details=details or {},
    )


def record_each(actor: Actor, action: Action, targets: Iterable[tuple[str | None, str]]) -> None:
    """One entry per `(queue, target)`, in one INSERT (a bulk cancel or discard).

    Caller contract and Raises: as `record`.
    """
    _require_transaction()
    AuditEntry.objects.bulk_create(
        AuditEntry(
            actor_kind=actor.kind,
            actor_name=actor.name,
            action=action,
            queue=queue,
            target=target,
            details={},
        )
        for queue, target in targets
    )


def _require_transaction() -> None:
    # An entry written in a transaction of its own could outlive a rolled-back
    # action, or be lost while the action commits.
    if not connection.in_atomic_block:
        raise RuntimeError("record the audit entry inside the action's transaction")
