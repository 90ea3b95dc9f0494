"""Dashboard pages (GET) and actions (POST, CSRF-checked), staff only: what they share.

Pages read through `dashboard.queries` and `dashboard.snapshot`; actions call
the domain layer (`queues.services`, `tasks.services`, `dlq.services`) and
redirect back with a message (post/redirect/get).  Which task may be
cancelled, which is live, when a lease runs out: the models and
`tasks.lifecycle` say, never these modules.  Each page and action names the
Django permission it needs (`dashboard.roles`); the templates offer only the
actions the user holds the permission of.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib.admin.views.decorators import staff_member_required
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
)
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from dashboard import queries

View = Callable[..., HttpResponseBase]


def page(permission: str) -> Callable[[View], View]:
    """A read-only page: staff login, GET (and HEAD) only, `permission` held."""

    def decorate(view: View) -> View:
        return staff_member_required(require_GET(requires(permission)(view)))

    return decorate


def action(permission: str) -> Callable[[View], View]:
    """A state-changing action: staff login, POST only (CSRF is checked by the
    middleware), `permission` held."""

    def decorate(view: View) -> View:
        return staff_member_required(require_POST(requires(permission)(view)))

    return decorate


def requires(permission: str) -> Callable[[View], View]:
    """403, and nothing done, unless the signed-in user holds `permission`."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not request.user.has_perm(permission):
                return forbidden(request)
            return view(request, *args, **kwargs)

        return checked

    return decorate


def forbidden(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/forbidden.html", status=403)


def back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    """Redirect to the form's `next` when it is a path on this site, else to `default`."""
    target = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = default
    return HttpResponseRedirect(target)


def not_found(request: HttpRequest, what: str) -> HttpResponse:
    return render(request, "dashboard/not_found.html", {"what": what}, status=404)


def with_cursor(request: HttpRequest, cursor: str | None) -> str:
    """This page's URL with `cursor` in place of the current one (none: the first page)."""
    params = request.GET.copy()
    params.pop("cursor", None)
    if cursor is not None:
        params["cursor"] = cursor
    return f"{request.path}?{params.urlencode()}"


def pager(request: HttpRequest, result: queries.Page | None) -> dict[str, str | None]:
    next_cursor = result.next_cursor if result else None
    return {
        "next_url": with_cursor(request, next_cursor) if next_cursor else None,
        "first_url": with_cursor(request, None) if request.GET.get("cursor") else None,
    }
