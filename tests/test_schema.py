"""The OpenAPI document (/api/schema/) and the docs page (/api/docs/)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern
from openapi_spec_validator import validate
from rest_framework import status

from taskforge import urls
from taskforge.api.bodies import Invalid
from taskforge.api.exceptions import PayloadTooLarge
from taskforge.api.hot import HotView
from tests import test_hot_parity as parity

pytestmark = pytest.mark.django_db

NOT_IN_SCHEMA = {"healthz", "readyz", "metrics", "schema", "docs"}
ERROR_REF = "#/components/schemas/Error"
HTTP_METHODS = {"get", "post", "put", "patch", "delete"}


@pytest.fixture(scope="module")
def spec(django_db_blocker: Any) -> dict[str, Any]:
    """The schema, fetched once: generating it walks every view."""
    with django_db_blocker.unblock():
        response = Client().get("/api/schema/?format=json")
    assert response.status_code == status.HTTP_200_OK
    assert response["Content-Type"].startswith("application/vnd.oai.openapi+json")
    document: dict[str, Any] = response.json()
    return document


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, op)
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if method in HTTP_METHODS
    ]


def api_routes() -> list[tuple[str, set[str]]]:
    """(OpenAPI path, implemented methods) of every API URL pattern."""
    routes = []
    for pattern in urls.urlpatterns:
        if not isinstance(pattern, URLPattern) or pattern.name in NOT_IN_SCHEMA:
            continue  # URLResolver: the admin site
        view_class = getattr(pattern.callback, "view_class", None)
        assert view_class is not None, f"{pattern.name}: not a class-based (DRF) view"
        methods = {m for m in HTTP_METHODS if hasattr(view_class, m)}
        path = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern))
        routes.append((path, methods))
    return routes


def test_schema__is_a_valid_openapi_3_document(spec: dict[str, Any]) -> None:
    validate(spec)

    assert spec["openapi"].startswith("3.")


def test_schema__is_public(spec: dict[str, Any]) -> None:
    """/api/schema/ answers without a key (the fixture fetched it without one)."""
    assert spec["info"]["title"]


@pytest.mark.parametrize(("path", "methods"), api_routes(), ids=[p for p, _ in api_routes()])
def test_schema__documents_every_route_with_its_methods(
    spec: dict[str, Any], path: str, methods: set[str]
) -> None:
    assert path in spec["paths"]
    documented = set(spec["paths"][path]) & HTTP_METHODS
    assert documented == methods


def test_schema__documents_no_route_that_does_not_exist(spec: dict[str, Any]) -> None:
    assert set(spec["paths"]) == {path for path, _ in api_routes()}


def test_schema__every_operation_needs_a_key_and_documents_401_and_403(
    spec: dict[str, Any],
) -> None:
    assert spec["components"]["securitySchemes"]["apiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": spec["components"]["securitySchemes"]["apiKey"]["description"],
    }
    for path, method, op in operations(spec):
        where = f"{method.upper()} {path}"
        security = op.get("security", spec.get("security"))
        assert security == [{"apiKey": []}], where  # no `{}`: the key is not optional
        assert {"401", "403"} <= set(op["responses"]), where


def test_schema__every_error_response_is_the_error_object(spec: dict[str, Any]) -> None:
    for path, method, op in operations(spec):
        for code, response in op["responses"].items():
            if int(code) < 400:
                continue
            where = f"{method.upper()} {path} {code}"
            assert response["description"], where
            assert set(response["content"]) == {"application/json"}, where
            assert response["content"]["application/json"]["schema"] == {"$ref": ERROR_REF}, where


def test_schema__error_object_matches_the_contract(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    error = schemas["Error"]
    assert error["required"] == ["error"]
    detail_ref = error["properties"]["error"]["$ref"]
    detail = schemas[detail_ref.rsplit("/", 1)[1]]
    assert sorted(detail["required"]) == ["code", "message"]
    assert detail["properties"]["code"]["type"] == "string"
    assert detail["properties"]["message"]["type"] == "string"
    fields = detail["properties"]["fields"]
    assert fields["type"] == "object"
    assert fields["additionalProperties"] == {"type": "array", "items": {"type": "string"}}


def test_schema__operations_with_a_body_document_body_errors(spec: dict[str, Any]) -> None:
    for path, method, op in operations(spec):
        if "requestBody" in op:
            assert {"400", "413", "415"} <= set(op["responses"]), f"{method.upper()} {path}"
            assert set(op["requestBody"]["content"]) == {"application/json"}


def test_schema__operations_on_a_named_object_document_404(spec: dict[str, Any]) -> None:
    for path, method, op in operations(spec):
        if "{" in path:
            assert "404" in op["responses"], f"{method.upper()} {path}"


def test_schema__operations_with_query_parameters_document_400(spec: dict[str, Any]) -> None:
    undocumented = [
        f"{method.upper()} {path}"
        for path, method, op in operations(spec)
        if any(p["in"] == "query" for p in op.get("parameters", []))
        and "400" not in op["responses"]
    ]
    assert undocumented == []


def test_schema__operation_ids_are_unique(spec: dict[str, Any]) -> None:
    ids = [op["operationId"] for _, _, op in operations(spec)]
    assert len(ids) == len(set(ids))


# /api/docs/ --------------------------------------------------------------------


class _Refs(HTMLParser):
    """Collects every src= and href= of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.refs += [value for name, value in attrs if name in ("src", "href") and value]


@pytest.fixture
def docs_page(client: Client) -> str:
    response = client.get("/api/docs/")
    assert response.status_code == status.HTTP_200_OK
    assert response["Content-Type"].startswith("text/html")
    return response.content.decode()


def test_docs__page_loads_nothing_from_another_host(docs_page: str) -> None:
    parser = _Refs()
    parser.feed(docs_page)

    assert parser.refs  # the page does load its assets
    assert all(ref.startswith("/static/") for ref in parser.refs), parser.refs
    assert re.search(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}", docs_page, re.IGNORECASE) is None


def test_docs__page_reads_the_local_schema(docs_page: str) -> None:
    assert 'url: "/api/schema/"' in docs_page


def test_docs__every_asset_it_references_is_served(docs_page: str, client: Client) -> None:
    parser = _Refs()
    parser.feed(docs_page)

    for ref in parser.refs:
        response = client.get(ref)
        try:
            assert response.status_code == status.HTTP_200_OK, ref
            assert response.getvalue(), ref  # the streamed file, joined
        finally:
            response.close()


# What the OpenAPI document cannot say about a body, so a rule's refusal that the
# request schema does not repeat: unknown fields (DRF's schemas never list
# additionalProperties), formats it names without checking (uuid, date-time), blank
# strings (minLength counts before trimming), the payload size, a rule across fields
# (scheduled_at with delay_seconds), integers past 2**53 in a number, a null body,
# and a null payload (a schema without a type, "any JSON value", cannot refuse null alone).
_INEXPRESSIBLE = (
    "Unknown field.",
    "Must be a valid UUID.",
    "Expected an ISO 8601 time",
    "This field may not be blank.",
    "Give scheduled_at or delay_seconds, not both.",
    "Number is out of range.",
    "No data provided",
)


def _hot_routes() -> list[tuple[str, Any]]:
    """(OpenAPI path, body rules) of each hot endpoint (taskforge.api.hot)."""
    routes = []
    for pattern in urls.urlpatterns:
        view_class = getattr(getattr(pattern, "callback", None), "view_class", None)
        if view_class is not None and issubclass(view_class, HotView):
            path = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern))
            routes.append((path, view_class.body))
    return routes


def _trimmed(value: Any) -> bool:
    """Holds a string with surrounding whitespace: the rules trim it, the schema cannot say."""
    if isinstance(value, str):
        return value != value.strip()
    if isinstance(value, dict):
        return any(_trimmed(item) for item in value.values())
    if isinstance(value, list):
        return any(_trimmed(item) for item in value)
    return False


def test_schema__hot_request_bodies_agree_with_the_rules_that_validate_them(
    spec: dict[str, Any],
) -> None:
    """The hot endpoints validate with `taskforge.api.bodies` rules, and the document
    describes them with serializers built from those rules.  Fed every body of
    tests/test_hot_parity.py, each request schema accepts what its rules accept, and
    refuses what they refuse, but for what a JSON schema cannot express."""
    from jsonschema import Draft7Validator  # type: ignore[import-untyped]  # no stubs

    routes = _hot_routes()
    assert len(routes) == 8
    by_path = {path: endpoint for endpoint, (path, _, _) in parity.ENDPOINTS.items()}
    checked = 0
    for path, rules in routes:
        operation = spec["paths"][path]["post"]
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        schema = {"$ref": ref, "components": spec["components"]}
        validator = Draft7Validator(schema)
        endpoint = by_path[path.replace("{name}", parity.Q)]
        for name, body in [(n, b) for e, n, b in parity.CASES if e == endpoint]:
            try:
                rules.validate(body)
                refused: list[str] = []
            except Invalid as exc:
                refused = [
                    message
                    for where, messages in exc.fields.items()
                    for message in messages
                    if not (where.endswith("payload") and message == "This field may not be null.")
                ]
            except PayloadTooLarge:
                refused = ["Number is out of range."]  # a size: inexpressible
            accepted_by_schema = validator.is_valid(body)
            if not refused and not _trimmed(body):
                assert accepted_by_schema, f"{endpoint} {name}: rules accept, schema refuses"
            expressible = [m for m in refused if not m.startswith(_INEXPRESSIBLE)]
            if expressible:
                assert not accepted_by_schema, (
                    f"{endpoint} {name}: rules refuse ({expressible}), schema accepts"
                )
            checked += 1
    assert checked > 1000
