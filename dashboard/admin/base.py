"""Admin pieces for tables of millions of rows (tasks, task events, DLQ).

Django's admin counts the rows of every change list (`COUNT(*)` over the
filtered table, twice unless `show_full_result_count = False`) to print page
numbers.  `LookaheadPaginator` never counts: it reads the current page plus one
row, so it knows whether a next page exists, and the change list shows
"Previous / Next" links instead of page numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django import forms
from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.utils.functional import cached_property

from queues.models import is_queue_name

QUEUE_NAME_MESSAGE = "Use 1 to 100 of A-Z a-z 0-9 _ . - , starting with a letter or digit."

_M = TypeVar("_M", bound=Model)


class LookaheadPaginator(Paginator[Any]):
    """A paginator whose `count` is "rows up to this page, plus one if there are more"."""

    def __init__(self, object_list: QuerySet[Any], per_page: int, *, page_number: int) -> None:
        super().__init__(object_list, per_page, orphans=0, allow_empty_first_page=True)
        self.queryset = object_list
        self.page_number = page_number

    @cached_property
    def count(self) -> int:
        start = (self.page_number - 1) * self.per_page
        # One LIMIT/OFFSET probe of primary keys on the list's own ordering.
        probe = self.queryset.values_list("pk", flat=True)[start : start + self.per_page + 1]
        return start + len(probe)


class LookaheadChangeList(ChangeList):
    """Adds the previous/next links the lookahead pagination template shows."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        # The lookahead "count" is no total: keep the search bar from printing
        # it as "N results".
        self.full_result_count = self.result_count

    @property
    def previous_page_url(self) -> str | None:
        return self.get_query_string({PAGE_VAR: self.page_num - 1}) if self.page_num > 1 else None

    @property
    def next_page_url(self) -> str | None:
        if self.result_count > self.page_num * self.list_per_page:
            return self.get_query_string({PAGE_VAR: self.page_num + 1})
        return None


class GuardedAdmin(admin.ModelAdmin[_M]):
    """Refuses (403) a posted action the user is not offered, and (400) a NUL in the
    change list's filters or search.

    Each action declares `allowed_permissions`, and the admin offers it only
    to users with them (superusers hold every permission).  Unguarded, a
    posted action that is not offered comes back as "No action selected"
    (or the list again), which does not say that the user may not take it.

    Postgres text cannot hold NUL: a filter on a field with choices
    (`?status__exact=%00`) passed Django's checks and failed in the query, a 500.
    """

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if any("\x00" in key or "\x00" in "".join(values) for key, values in request.GET.lists()):
            return HttpResponseBadRequest(
                "A filter or search holds a NUL character.", content_type="text/plain"
            )
        name = request.POST.get("action") if request.method == "POST" else None
        if name is not None and name not in self.get_actions(request):
            raise PermissionDenied
        return super().changelist_view(request, extra_context)


class LargeTableAdmin(GuardedAdmin[Any]):
    """Change lists that stay cheap on a table of millions of rows."""

    show_full_result_count = False
    list_max_show_all = 0  # "Show all" would list the whole table
    actions_selection_counter = False  # its "select all N" needs the count
    list_per_page = 50
    change_list_template = "admin/large_table_change_list.html"
    show_facets = admin.ShowFacets.NEVER  # facet counts are COUNT(*)s per filter choice

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return LookaheadChangeList

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Paginator[Any]:
        try:
            page_number = max(int(request.GET.get(PAGE_VAR, 1)), 1)
        except ValueError:
            page_number = 1
        return LookaheadPaginator(queryset, per_page, page_number=page_number)


class AsSentNameForm(forms.ModelForm[Any]):
    """A form whose `name` is taken as typed (API.md "Strings are taken as sent"):
    Django's form fields trim by default, which made " q" the queue "q".

    `name_rule` returns why a name cannot be, or None.
    """

    name_rule: Callable[[str], str | None]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields.get("name")
        if isinstance(field, forms.CharField):
            field.strip = False

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        problem = type(self).name_rule(name)
        if problem is not None:
            raise forms.ValidationError(problem)
        return name


def queue_name_problem(name: str) -> str | None:
    """A queue's or a schedule's name: the API's rule (`queues.models.is_queue_name`)."""
    return None if is_queue_name(name) else QUEUE_NAME_MESSAGE


class ReadOnlyAdminMixin:
    """No add, change or delete through the admin: the domain layer writes these rows."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
