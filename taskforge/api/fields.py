"""Strict serializer fields: JSON types are taken as they are, never coerced.

DRF's stock fields accept `"5"` for an integer and `5` for a string; a task
queue's contract should not guess, so these refuse the wrong JSON type.
"""

from __future__ import annotations

import copy
import math
from datetime import datetime
from typing import Any, TypeAlias

from rest_framework import serializers

from taskforge.lib.timeutil import isoformat, parse_time

# A field of any value, data and representation types.
AnyField: TypeAlias = "serializers.Field[Any, Any, Any, Any]"


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        if isinstance(data, float) and not (math.isfinite(data) and data.is_integer()):
            self.fail("invalid")
        return super().to_internal_value(int(data))


class StrictNumberField(serializers.FloatField):
    default_error_messages = {"out_of_range": "Number is out of range."}

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        if isinstance(data, int) and abs(data) > 2**53:
            # float() of a huge int raises OverflowError; DRF's stock message
            # for this code ("String value too large.") would misname a number.
            self.fail("out_of_range")
        return super().to_internal_value(float(data))


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class TimeField(serializers.DateTimeField):
    """ISO 8601 with `Z` or an offset; written back in UTC with `Z`."""

    default_error_messages = {
        "invalid": "Expected an ISO 8601 time with 'Z' or an offset, up to year 9999.",
    }

    def to_internal_value(self, value: Any) -> datetime:
        try:
            return parse_time(value)
        except (ValueError, TypeError):
            self.fail("invalid")
        raise AssertionError("unreachable")

    def to_representation(self, value: datetime) -> str:
        return isoformat(value)


class AnyJSONField(serializers.JSONField):
    """Any JSON value as parsed from the body (no second decode of strings)."""

    def to_internal_value(self, data: Any) -> Any:
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class StrictSerializer(serializers.Serializer[Any]):
    """Refuses a body that is not an object, and any field it does not know."""

    def get_fields(self) -> dict[str, AnyField]:
        # DRF deep-copies every declared field per request, re-running each
        # field's __init__: a fifth of a millisecond per body on the hot
        # paths.  A field keeps no per-request state (bind() sets its name and
        # parent on the copy), so a shallow copy does; a list field's child
        # is copied too, nested serializers the DRF way.
        return {name: _copy_field(field) for name, field in self._declared_fields.items()}

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": ["Expected a JSON object."]}, code="invalid"
            )
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError(
                {name: ["Unknown field."] for name in unknown}, code="invalid"
            )
        return super().to_internal_value(data)


def _copy_field(field: AnyField) -> AnyField:
    if isinstance(field, serializers.BaseSerializer):
        return copy.deepcopy(field)
    clone = copy.copy(field)
    # The fields with a child: ListField, DictField (and HStoreField, a DictField).
    if isinstance(clone, serializers.ListField | serializers.DictField):
        clone.child = _copy_field(clone.child)  # bound already, by the list field's __init__
        # The stubs type a field's parent as a serializer; DRF makes the list field the
        # parent of its child.
        clone.child.parent = clone  # type: ignore[assignment]
    return clone


class QuerySerializer(serializers.Serializer[Any]):
    """Query parameters: one given empty (`?status=`) is invalid, not absent (but those
    named in `empty_allowed`, where empty means something)."""

    empty_allowed: tuple[str, ...] = ()

    def to_internal_value(self, data: Any) -> Any:
        # keys(): BindingDict iterates its names, but its stubs say it iterates fields.
        empty = [
            name
            for name in self.fields.keys()
            if name in data and data.get(name) == "" and name not in self.empty_allowed
        ]
        if empty:
            raise serializers.ValidationError({name: ["May not be empty."] for name in empty})
        return super().to_internal_value(data)
