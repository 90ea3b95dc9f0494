"""The hot endpoints: served without DRF's view machinery, answering exactly as DRF did.

The task lifecycle's endpoints (enqueue and its batch, claim, heartbeat, ack,
nack and the batch forms) carry nearly all of the API's traffic.  Each is a
`HotView`: a DRF APIView, so the OpenAPI document, the `Allow` header and
every unusual request are DRF's, whose POST is served by `serve()`, a plain
function of the request:

1. authentication: `ApiKeyAuthentication` itself (401 as DRF answers it);
2. the role: the view's `roles["POST"]` (403);
3. the body: `parsers.parse_body` (400 `parse_error`) and the view's `body`
   rules (`taskforge.api.bodies`: 400 `invalid` as DRF's serializers said it);
4. the view's `handle(request, key, data, **kwargs)`: the domain call,
   returning the answer's data and status;
5. any exception through `exceptions.error_answer`, like DRF's handler.

The URL routes to `as_hot_view()`.  A POST with a plain JSON body (Content-
Type `application/json`, no query string, an Accept the JSON renderer takes)
goes straight to `serve()`; any other request (other methods, form bodies,
`?format=`, content negotiation, OPTIONS) goes to the DRF view, whose `post`
calls the same `handle` with the same rules, so there is one implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from django.http import HttpRequest, HttpResponse
from rest_framework import exceptions as drf
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from taskforge.api.authentication import ApiKeyAuthentication
from taskforge.api.bodies import Obj
from taskforge.api.exceptions import error_answer
from taskforge.api.models import ApiKey
from taskforge.api.negotiation import JSON_ACCEPTS
from taskforge.api.parsers import parse_body
from taskforge.api.renderers import render_json

Answer = tuple[Any, int]

_authenticator = ApiKeyAuthentication()


# An endpoint whose POST is served by `serve()`; see the module's docstring.  (No
# docstring: drf-spectacular would take it for each operation's description.)
class HotView(APIView):
    roles: ClassVar[dict[str, frozenset[str]]]
    body: ClassVar[Obj]

    @staticmethod
    def context(**kwargs: Any) -> dict[str, Any]:
        """What `handle` gets from the URL's arguments, resolved before the body is read
        (the enqueue's queue: an unknown one is a 404 whatever the body)."""
        return kwargs

    @staticmethod
    def handle(request: HttpRequest, key: ApiKey, data: dict[str, Any], **context: Any) -> Answer:
        raise NotImplementedError

    def serve_drf(self, request: Request, **kwargs: Any) -> Response:
        """The POST on DRF's path: DRF authenticated and parses; the same rules and handler."""
        key = request.auth
        assert isinstance(key, ApiKey)  # the role was checked: a key authenticated
        context = self.context(**kwargs)
        data = self.body.validate(request.data)
        answer, status = self.handle(request._request, key, data, **context)
        return Response(answer, status=status)

    @classmethod
    def serve(cls, request: HttpRequest, **kwargs: Any) -> HttpResponse:
        """The POST on the hot path: steps 1 to 5 of the module's docstring."""
        try:
            found = _authenticator.authenticate(request)  # type: ignore[arg-type]
            if found is None:
                raise drf.NotAuthenticated()
            principal, key = found
            if principal.role not in cls.roles["POST"]:
                raise drf.PermissionDenied()
            context = cls.context(**kwargs)
            data = cls.body.validate(parse_body(request.body))
            answer, status = cls.handle(request, key, data, **context)
        except Exception as exc:
            status, answer, headers = error_answer(exc)
            response = _json(answer, status)
            for name, value in headers.items():
                response[name] = value
            return response
        return _json(answer, status)

    @classmethod
    def as_hot_view(cls) -> Callable[..., HttpResponse]:
        """The URL's view: plain JSON POSTs to `serve()`, everything else to DRF's view."""
        drf_view = cls.as_view()
        allow = allow_header(cls())

        def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            if not is_plain_json_post(request.META):
                response: HttpResponse = drf_view(request, **kwargs)
                return response
            response = cls.serve(request, **kwargs)
            response["Allow"] = allow  # as DRF's views answer
            return response

        # What DRF's as_view() leaves on its view: drf-spectacular and the
        # body limit (taskforge.api.middleware) read the class, CSRF is not
        # for API keys.
        view.cls = view.view_class = cls  # type: ignore[attr-defined]
        view.initkwargs = view.view_initkwargs = {}  # type: ignore[attr-defined]
        view.csrf_exempt = True  # type: ignore[attr-defined]
        view.__name__ = cls.__name__
        view.__doc__ = cls.__doc__
        return view


def is_plain_json_post(meta: dict[str, Any]) -> bool:
    """A POST that `serve()` answers: a JSON body of a stated length, no query
    string, and an Accept the JSON renderer takes (the module's docstring)."""
    return (
        meta.get("REQUEST_METHOD", "").upper() == "POST"
        and meta.get("CONTENT_TYPE") == "application/json"
        and bool(meta.get("CONTENT_LENGTH"))
        and not meta.get("QUERY_STRING")
        and meta.get("HTTP_ACCEPT", "") in JSON_ACCEPTS
    )


def allow_header(view: APIView) -> str:
    """The `Allow` header of DRF's answers: View.setup() serves HEAD as GET."""
    if hasattr(view, "get") and not hasattr(view, "head"):
        view.head = view.get  # type: ignore[attr-defined]
    return ", ".join(view.allowed_methods)


def _json(data: Any, status: int) -> HttpResponse:
    return HttpResponse(render_json(data), status=status, content_type="application/json")
