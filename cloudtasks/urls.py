"""The /v2/ routes: one path converter, one view (cloudtasks.views routes within)."""

from __future__ import annotations

from django.urls import URLPattern, path

from cloudtasks import views

urlpatterns: list[URLPattern] = [
    path("v2/<path:path>", views.v2, name="cloudtasks-v2"),
]
