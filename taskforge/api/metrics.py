"""GET /metrics: Prometheus exposition of `taskforge.metrics` (API.md, "Operations")."""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from prometheus_client.exposition import choose_encoder

from taskforge.api.health import probe
from taskforge.api.responses import error_response
from taskforge.conf import conf
from taskforge.metrics import scrape_collector


@probe
def metrics(request: HttpRequest) -> HttpResponse:
    """No API key; `Authorization: Bearer $TASKFORGE_METRICS_TOKEN` when that is set."""
    token = conf.METRICS_TOKEN
    if token and not _bearer_matches(request, token):
        response = error_response(
            401, "unauthenticated", "Missing or wrong metrics token (TASKFORGE_METRICS_TOKEN)."
        )
        response["WWW-Authenticate"] = 'Bearer realm="taskforge-metrics"'
        return response
    encoder, content_type = choose_encoder(request.META.get("HTTP_ACCEPT", ""))
    return HttpResponse(encoder(scrape_collector()), content_type=content_type)


def _bearer_matches(request: HttpRequest, token: str) -> bool:
    scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    # Constant-time, so response timing does not reveal the token.
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )
