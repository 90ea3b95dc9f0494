"""Admin pieces for tables of millions of rows (tasks, task events, DLQ).

Django's admin counts the rows of every change list (`COUNT(*)` over the
filtered table, twice unless `show_full_result_count = False`) to print page
numbers.  `LookaheadPaginator` never counts: it reads the current page plus one
row, so it knows whether a next page exists, and the change list shows
"Previous / Next" links instead of page numbers.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property


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


class LargeTableAdmin(admin.ModelAdmin[Any]):
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


class ReadOnlyAdminMixin:
    """No add, change or delete through the admin: the domain layer writes these rows."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
