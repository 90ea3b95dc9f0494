"""Sign-in throttling for staff (API.md "Security (v1.2)", People), by django-axes.

After 5 failed sign-ins for one user name, or 20 from one client address,
further sign-ins for it are refused, the right password included, for
AXES_COOLOFF_TIME (15 minutes): the admin's login form answers 429 and says so,
and each refusal is logged (`signin.refused`, with the user name and the
client address).

axes keeps the failed attempts in Postgres (its database handler: one row per
user name, address and browser, with its failures and the time of the last
one; rows whose last failure is older than the cool-off no longer count and
are deleted).  It has a single failure limit for every lockout parameter;
`SignInAttempts` is its handler with a limit per parameter, the way axes'
maintainers point to for this (jazzband/django-axes#661).  The client address
is `taskforge.api.peer.client_address`, the request log's.
"""

from __future__ import annotations

import logging
from typing import Any

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_cool_off, get_lockout_parameters
from django.contrib import admin
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import QuerySet, Sum
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from taskforge.api.peer import client_address

logger = logging.getLogger(__name__)

# Failed sign-ins, within the cool-off, that lock out a user name or a client address
# (AXES_LOCKOUT_PARAMETERS names the two).
FAILURE_LIMITS = {"username": 5, "ip_address": 20}


class SignInAttempts(AxesDatabaseHandler):  # type: ignore[misc]  # axes has no annotations
    """axes' database handler with a failure limit per lockout parameter.

    axes locks out when `get_failures()` reaches AXES_FAILURE_LIMIT; here it
    counts the limits of FAILURE_LIMITS that the request's user name and
    address have reached, so AXES_FAILURE_LIMIT is 1: either one locks out.
    """

    def get_failures(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        return len(self._reached(request, credentials))

    def user_login_failed(
        self,
        sender: Any,
        credentials: dict[str, Any],
        request: HttpRequest | None = None,
        **kwargs: Any,
    ) -> None:
        locked_before = getattr(request, "axes_locked_out", False)
        super().user_login_failed(sender, credentials, request, **kwargs)
        if request is None or locked_before or not getattr(request, "axes_locked_out", False):
            return
        # This failure locked the user name or address out.  The lock lasts the
        # cool-off from now: axes counts a row until the cool-off after its own
        # last failure, and the rows of other addresses (or user names) that
        # counted toward the limit would otherwise lift it sooner.
        for attempts in self._reached(request, credentials):
            attempts.update(attempt_time=request.axes_attempt_time)  # type: ignore[attr-defined]

    def _reached(
        self, request: HttpRequest, credentials: dict[str, Any] | None
    ) -> list[QuerySet[Any]]:
        """The attempts (one queryset per lockout parameter) that reached their limit."""
        parameters = get_lockout_parameters(request, credentials)
        reached = []
        for parameter, attempts in zip(
            parameters, self.get_user_attempts(request, credentials), strict=True
        ):
            failures = attempts.aggregate(n=Sum("failures_since_start"))["n"] or 0
            if failures >= FAILURE_LIMITS[parameter]:
                reached.append(attempts)
        return reached


def lockout_message() -> str:
    minutes = round(get_cool_off().total_seconds() / 60)
    return (
        f"Too many failed sign-ins: sign-in is locked for {minutes} minutes. "
        "Please try again later."
    )


def locked_out(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict[str, Any] | None = None,
) -> HttpResponse:
    """The answer to a refused sign-in (AXES_LOCKOUT_CALLABLE): the admin's login
    form saying that sign-in is locked, status 429; logs `signin.refused`."""
    username = get_client_username(request, credentials) or ""
    logger.warning(
        "signin.refused", extra={"username": username, "remote_addr": client_address(request)}
    )
    context = {
        **admin.site.each_context(request),
        "title": "Log in",
        "app_path": request.get_full_path(),
        "form": AuthenticationForm(request, initial={"username": username}),
        "next": request.POST.get("next", ""),
        "lockout_message": lockout_message(),
    }
    # Rendered here: the answer goes back out through the middleware, past the
    # point where Django renders a view's template response.
    return TemplateResponse(request, "admin/login_locked.html", context, status=429).render()
