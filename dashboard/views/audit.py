"""The audit log page: who did what, newest first, with the filters of GET /audit."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from dashboard import formatting as fmt
from dashboard import queries, roles
from dashboard.forms import AuditFilterForm
from dashboard.views.base import page, pager
from taskforge.audit.models import AuditEntry
from taskforge.lib import keyset

ORDERING = ["-at", "-id"]  # audit_at_idx


def audit_page(data: dict[str, Any], *, limit: int = queries.PAGE_SIZE) -> queries.Page:
    """One page of entries matching the cleaned filters, newest first.

    Raises: BadCursor.
    """
    entries = AuditEntry.objects.all()
    for key, lookup in [
        ("action", "action"),
        ("actor", "actor_name"),
        ("queue", "queue"),
        ("after", "at__gt"),
        ("before", "at__lt"),
    ]:
        if data.get(key):
            entries = entries.filter(**{lookup: data[key]})
    if data.get("cursor"):
        at, pk = keyset.decode(data["cursor"], 2)
        if not isinstance(at, datetime) or isinstance(pk, bool) or not isinstance(pk, int):
            raise queries.BadCursor()
        entries = entries.filter(keyset.after(ORDERING, [at, pk]))
    rows = list(entries.order_by(*ORDERING)[: limit + 1])
    if len(rows) <= limit:
        return queries.Page(rows, None)
    return queries.Page(rows[:limit], keyset.cursor_of(rows[limit - 1], ORDERING))


@page(roles.VIEW_AUDIT)
def audit(request: HttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET)
    result: queries.Page | None = None
    if form.is_valid():
        try:
            result = audit_page(form.cleaned_data)
        except queries.BadCursor:
            form.add_error(None, "That page link is not valid any more; start from the top.")
    now = timezone.now()
    rows = [
        {"entry": entry, "ago": fmt.ago(entry.at, now)} for entry in (result.rows if result else [])
    ]
    return render(
        request,
        "dashboard/audit.html",
        {"form": form, "rows": rows, **pager(request, result), "nav": "audit"},
    )
