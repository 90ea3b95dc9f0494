"""Dashboard pages (GET) and actions (POST, CSRF-checked), staff only: what they share.

Pages read through `dashboard.queries` and `dashboard.snapshot`; actions call
the domain layer (`queues.services`, `tasks.services`, `dlq.services`) and
redirect back with a message (post/redirect/get).  Which task may be
cancelled, which is live, when a lease runs out: the models and
`tasks.lifecycle` say, never these modules.
"""

from __future__ import annotations

from collections.abc import Callable

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


def page(view: View) -> View:
    """A read-only page: staff login, GET (and HEAD) only."""
    return staff_member_required(require_GET(view))


def action(view: View) -> View:
    """A state-changing action: staff login, POST only (CSRF is checked by the middleware)."""
    return staff_member_required(require_POST(view))


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
