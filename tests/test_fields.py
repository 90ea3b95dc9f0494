"""taskforge.api.fields: the serializers' per-request field copies."""

from __future__ import annotations

from rest_framework import serializers

from taskforge.api.fields import StrictCharField, StrictSerializer


class Body(StrictSerializer):
    name = StrictCharField(max_length=5)
    tags = serializers.ListField(child=StrictCharField(max_length=3), max_length=2)


def test_strict_serializer__each_instance_has_its_own_bound_fields() -> None:
    """Fields are copied per instance (as DRF does), cheaply: nothing is shared."""
    a, b = Body(data={}), Body(data={})
    for name in ("name", "tags"):
        assert a.fields[name] is not b.fields[name]
        assert a.fields[name] is not Body._declared_fields[name]
        assert a.fields[name].parent is a and b.fields[name].parent is b
    a_tags, b_tags = a.fields["tags"], b.fields["tags"]
    assert isinstance(a_tags, serializers.ListField) and isinstance(b_tags, serializers.ListField)
    assert a_tags.child is not b_tags.child
    parent: object = a_tags.child.parent  # a serializer in the stubs, the list field in DRF
    assert parent is a_tags


def test_strict_serializer__copies_validate_like_the_declared_fields() -> None:
    ok = Body(data={"name": "abc", "tags": ["x", "yz"]})
    assert ok.is_valid(), ok.errors
    assert ok.validated_data == {"name": "abc", "tags": ["x", "yz"]}
    bad = Body(data={"name": "abcdef", "tags": ["long", "a", "b"]})
    assert not bad.is_valid()
    assert set(bad.errors) == {"name", "tags"}
    again = Body(data={"name": "abc", "tags": ["abcd"]})  # no state left by the failure
    assert not again.is_valid() and set(again.errors) == {"tags"}


def test_json_renderer__same_bytes_as_drfs() -> None:
    """The API's renderer (taskforge.lib.jsonutil) writes what DRF's JSONRenderer writes."""
    import uuid
    from datetime import UTC, datetime

    from rest_framework.exceptions import ErrorDetail
    from rest_framework.renderers import JSONRenderer as DrfRenderer

    from taskforge.api.renderers import JSONRenderer
    from tasks.models import TaskStatus

    documents = [
        {"tasks": [{"id": str(uuid.uuid4()), "payload": {"a": [1, 2.5, None]}, "ok": True}]},
        {"error": {"code": "validation_error", "fields": {"x": [ErrorDetail("Bad.", "invalid")]}}},
        {"status": TaskStatus.EXECUTING, "at": datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)},
        {"text": "line \u2028 and \u2029 separators, ünïcödé"},
        {"big": 10**30},
        [],
    ]
    for document in documents:
        assert JSONRenderer().render(document) == DrfRenderer().render(document), document
    assert JSONRenderer().render(None) == b""
    pretty = "application/json; indent=2"
    assert JSONRenderer().render({"a": 1}, pretty) == DrfRenderer().render({"a": 1}, pretty)
