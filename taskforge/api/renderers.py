"""The API's JSON renderer: DRF's, encoding with taskforge.lib.jsonutil."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rest_framework import renderers

from taskforge.lib import jsonutil


class Rendered:
    """An answer's JSON, encoded already (a list's page: taskforge.api.pagination)."""

    __slots__ = ("body",)

    def __init__(self, body: bytes) -> None:
        self.body = body


class JSONRenderer(renderers.JSONRenderer):
    """Same bytes as DRF's JSONRenderer (compact, UTF-8, U+2028/U+2029 escaped).

    Every response goes through here; a claim of 100 tasks or a 1000-task
    batch enqueue spends milliseconds in the stdlib encoder.
    """

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        if data is None:
            return b""
        # get_indent takes a false media type for none given (DRF passes None); its stubs want
        # a str.
        indent = self.get_indent(accepted_media_type or "", renderer_context or {})
        if isinstance(data, Rendered):
            if indent is None:
                return data.body
            # Pretty, for a person reading (rare). Our own JSON: the stdlib's parser, which
            # has no depth limit to trip on a payload nested 100 levels inside the page.
            data = json.loads(data.body)
        if indent is not None:
            return super().render(data, accepted_media_type, renderer_context)
        return render_json(data)


_default = JSONRenderer.encoder_class().default


def render_json(data: Any) -> bytes:
    """`data` as the API's JSON: compact UTF-8, U+2028/U+2029 escaped (the hot views' too)."""
    body = jsonutil.dumps(data, default=_default)
    # As DRF: JSON that is also a strict JavaScript subset.
    if b"\xe2\x80" in body:
        body = body.replace("\u2028".encode(), b"\\u2028").replace("\u2029".encode(), b"\\u2029")
    return body
