"""Content negotiation: DRF's, answered at once for what clients send nearly always."""

from __future__ import annotations

from collections.abc import Sequence

from django.core.exceptions import TooManyFieldsSent
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.settings import api_settings

# Accept headers whose answer is the JSON renderer, whatever else is configured.
JSON_ACCEPTS = frozenset({"", "*/*", "application/json"})


class ContentNegotiation(DefaultContentNegotiation):
    """DRF's negotiation, minus its Accept parsing when the answer is plain JSON.

    A worker or producer sends no Accept header, `*/*` or `application/json`
    on every call; DRF parses it into media types each time (~2% of a claim's
    CPU in py-spy).  Anything else (`?format=`, parameters such as
    `indent=2`, other types) goes through DRF's code.
    """

    # The stubs declare `renderers` an Iterable; DRF passes the view's list and its own
    # select_renderer indexes it as well.
    def select_renderer(  # type: ignore[override]
        self, request: Request, renderers: Sequence[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        first = renderers[0]
        try:
            format_override = api_settings.URL_FORMAT_OVERRIDE in request.query_params
        except TooManyFieldsSent:
            # Negotiation comes before authentication: the 400 comes once the key is known
            # (taskforge.api.permissions), in JSON.
            return first, first.media_type
        if (
            first.media_type == "application/json"
            and request.META.get("HTTP_ACCEPT", "") in JSON_ACCEPTS
            and not format_suffix
            and not format_override
        ):
            return first, first.media_type
        chosen: tuple[BaseRenderer, str] = super().select_renderer(
            request, renderers, format_suffix
        )
        return chosen
