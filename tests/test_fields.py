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
    assert a.fields["tags"].child is not b.fields["tags"].child
    assert a.fields["tags"].child.parent is a.fields["tags"]


def test_strict_serializer__copies_validate_like_the_declared_fields() -> None:
    ok = Body(data={"name": "abc", "tags": ["x", "yz"]})
    assert ok.is_valid(), ok.errors
    assert ok.validated_data == {"name": "abc", "tags": ["x", "yz"]}
    bad = Body(data={"name": "abcdef", "tags": ["long", "a", "b"]})
    assert not bad.is_valid()
    assert set(bad.errors) == {"name", "tags"}
    again = Body(data={"name": "abc", "tags": ["abcd"]})  # no state left by the failure
    assert not again.is_valid() and set(again.errors) == {"tags"}
