"""Security headers the project adds on top of Django's SecurityMiddleware.

- A Content-Security-Policy on every page under /admin/ (the dashboard and
  Django admin): scripts, styles and everything else from this origin only,
  never inline (API.md v1.1: scripts exclude 'unsafe-inline').  Neither has
  inline script or style; `tests/test_security_headers.py` checks templates
  and pages.  JSON answers get a policy that allows nothing at all.
- Cookies are `Secure` on every answer to a request that came over TLS
  (directly, or through a proxy trusted with TASKFORGE_TRUST_PROXY), so a
  session or CSRF cookie set over HTTPS never travels over plain HTTP.
  HSTS goes on the same answers (Django's SecurityMiddleware, with
  SECURE_HSTS_SECONDS from TASKFORGE_HSTS_SECONDS).
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase

DASHBOARD_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
API_POLICY = "default-src 'none'; frame-ancestors 'none'"

HEADER = "Content-Security-Policy"


class SecurityHeadersMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        add_security_headers(request, response)
        return response


def add_security_headers(request: HttpRequest, response: HttpResponseBase) -> None:
    """The policy header of `response`, and `Secure` on its cookies over TLS."""
    if HEADER not in response:
        if request.path.startswith("/admin/"):
            response[HEADER] = DASHBOARD_POLICY
        elif response.get("Content-Type", "").startswith("application/json"):
            response[HEADER] = API_POLICY
    if request.is_secure():
        for morsel in response.cookies.values():
            morsel["secure"] = True
