"""The /v2/ routes: every path under /v2/ to one view (cloudtasks.views routes within)."""

from __future__ import annotations

from django.urls import URLPattern, re_path

from cloudtasks import views

urlpatterns: list[URLPattern] = [
    re_path(r"^v2/(?P<path>.*)$", views.v2, name="cloudtasks-v2"),
    # The OIDC discovery of the ID tokens push requests carry (public).
    re_path(r"^\.well-known/jwks\.json$", views.jwks, name="oidc-jwks"),
    re_path(
        r"^\.well-known/openid-configuration$",
        views.openid_configuration,
        name="oidc-configuration",
    ),
]
