"""Role checks: each view names the roles allowed per HTTP method."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from taskforge.api.authentication import ApiPrincipal
from taskforge.api.models import Role

ANY_ROLE = frozenset(Role.values)
PRODUCER = frozenset({Role.PRODUCER, Role.ADMIN})
WORKER = frozenset({Role.WORKER, Role.ADMIN})
ADMIN = frozenset({Role.ADMIN})


class HasRole(BasePermission):
    """Allow a request when its key's role is in `view.roles[method]`.

    Views declare `roles = {"GET": ANY_ROLE, "POST": ADMIN, ...}`; a method
    missing from the table is admin-only.  No key at all is a 401, a key of
    the wrong role a 403.
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        # ApiKeyAuthentication is the only authenticator: a request without a valid key
        # has no principal (UNAUTHENTICATED_USER is None).
        principal: object = request.user
        if not isinstance(principal, ApiPrincipal):
            return False
        roles: dict[str, frozenset[str]] = getattr(view, "roles", {})
        allowed = roles.get(request.method or "GET", ADMIN)
        if request.method == "HEAD":
            allowed = roles.get("GET", ADMIN)
        if principal.role not in allowed:
            return False
        # The query string is parsed here, for every view and whether it reads it or not:
        # more than DATA_UPLOAD_MAX_NUMBER_FIELDS parameters raises TooManyFieldsSent,
        # a 400 `invalid` (taskforge.api.exceptions), after the 401 and 403 above.
        request.query_params  # noqa: B018
        return True
