"""Request bodies declared once: validated without DRF, described to the schema by DRF fields.

The hot endpoints (enqueue and its batch, claim, heartbeat, ack, nack and the
batch forms) validate their bodies here: a body is a tree of rules (`Obj`,
`ListOf`, `Int`, `Str`, ...) whose `clean()` walks the parsed JSON once.  A
DRF serializer spent several times as long on the same checks (copying its
fields, binding them, its validator objects and error details per request).

Each rule is the one home of what it checks:

- its errors are DRF's, word for word and at the same paths (`tasks[3].priority`),
  so answers did not change (tests/test_hot_parity.py replays them);
- `field()` builds the DRF field that describes it, and `Obj.serializer()` the
  serializer drf-spectacular reads for the OpenAPI document; nothing validates
  with those (tests/test_schema.py checks that the document and the rules agree).

Errors are collected in a flat `{path: [messages]}`; `Invalid` carries them to
the exception handler (400 `invalid`).  A payload over its size limit raises
`PayloadTooLarge` (413) at once, as the serializers did.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from django.core.validators import RegexValidator
from rest_framework import serializers

from taskforge.api import fields as drf_fields
from taskforge.lib import names
from taskforge.lib.timeutil import parse_time

Errors = dict[str, list[str]]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
# What clean() returns for a value it recorded errors for.
_BAD: Any = _Missing()

NON_FIELD = "non_field_errors"


class Invalid(Exception):
    """A body that breaks its rules; `fields` maps each path to its messages."""

    def __init__(self, fields: Errors) -> None:
        super().__init__(fields)
        self.fields = fields


class Rule:
    """One value of a body.  `required` unless a default is given or `required=False`."""

    def __init__(
        self,
        *,
        required: bool = True,
        default: Any = MISSING,
        allow_null: bool = False,
        help_text: str | None = None,
    ) -> None:
        self.required = required and default is MISSING
        self.default = default
        self.allow_null = allow_null
        self.help_text = help_text

    def clean(self, value: Any, path: str, errors: Errors) -> Any:
        """The value as the endpoint uses it, or _BAD with its errors recorded."""
        if value is None:
            if self.allow_null:
                return None
            return _fail(errors, path, "This field may not be null.")
        return self.convert(value, path, errors)

    def convert(self, value: Any, path: str, errors: Errors) -> Any:
        raise NotImplementedError

    def field(self) -> drf_fields.AnyField:
        """The DRF field that describes this rule to the OpenAPI document."""
        raise NotImplementedError

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"allow_null": self.allow_null}
        if self.default is not MISSING:
            options["default"] = self.default
        elif not self.required:
            options["required"] = False
        if self.help_text:
            options["help_text"] = self.help_text
        return options


def _fail(errors: Errors, path: str, *messages: str) -> Any:
    errors.setdefault(path or NON_FIELD, []).extend(messages)
    return _BAD


def _bounds(value: float, minimum: float | None, maximum: float | None) -> list[str]:
    messages = []
    if maximum is not None and value > maximum:
        messages.append(f"Ensure this value is less than or equal to {maximum}.")
    if minimum is not None and value < minimum:
        messages.append(f"Ensure this value is greater than or equal to {minimum}.")
    return messages


class Int(Rule):
    """A JSON integer (or a float with an integral value), never a string or a bool."""

    def __init__(self, *, min_value: int | None = None, max_value: int | None = None, **kw: Any):
        super().__init__(**kw)
        self.min_value = min_value
        self.max_value = max_value

    def convert(self, value: Any, path: str, errors: Errors) -> Any:
        if type(value) is not int:
            if not isinstance(value, float) or not (math.isfinite(value) and value.is_integer()):
                return _fail(errors, path, "A valid integer is required.")
            value = int(value)
        messages = _bounds(value, self.min_value, self.max_value)
        return _fail(errors, path, *messages) if messages else value

    def field(self) -> drf_fields.AnyField:
        return drf_fields.StrictIntegerField(
            min_value=self.min_value, max_value=self.max_value, **self._options()
        )


class Number(Rule):
    """A JSON number, as a float; integers past 2**53 are out of range."""

    def __init__(
        self, *, min_value: float | None = None, max_value: float | None = None, **kw: Any
    ):
        super().__init__(**kw)
        self.min_value = min_value
        self.max_value = max_value

    def convert(self, value: Any, path: str, errors: Errors) -> Any:
        kind = type(value)
        if kind is int:
            if abs(value) > 2**53:
                return _fail(errors, path, "Number is out of range.")
        elif kind is not float:
            return _fail(errors, path, "A valid number is required.")
        value = float(value)
        messages = _bounds(value, self.min_value, self.max_value)
        return _fail(errors, path, *messages) if messages else value

    def field(self) -> drf_fields.AnyField:
        return drf_fields.StrictNumberField(
            min_value=self.min_value, max_value=self.max_value, **self._options()
        )


class Bool(Rule):
    def convert(self, value: Any, path: str, errors: Errors) -> Any:
        if type(value) is not bool:
            return _fail(errors, path, "Must be a valid boolean.")
        return value

    def field(self) -> drf_fields.AnyField:
        return drf_fields.StrictBooleanField(**self._options())


class Str(Rule):
    """A JSON string; trimmed unless `trim=False`; blank (after trimming) is refused.

    `as_sent`: never trimmed, and whitespace at either end or a control character
    anywhere is refused (`taskforge.lib.names`); blank is still "may not be blank".
    """

    def __init__(
        self,
        *,
        min_length: int | None = None,
        max_length: int | None = None,
        trim: bool = True,
        as_sent: bool = False,
        pattern: str | None = None,
        pattern_message: str = "",
        **kw: Any,
    ):
        super().__init__(**kw)
        self.min_length = min_length
        self.max_length = max_length
        self.trim = trim and not as_sent
        self.as_sent = as_sent
        self.pattern = pattern
        self.pattern_message = pattern_message
        self._search = re.compile(pattern).search if pattern else None

    def clean(self, value: Any, path: str, errors: Errors) -> Any:
        # DRF's CharField: the blank check comes before the null and type checks.
        if value == "" or ((self.trim or self.as_sent) and str(value).strip() == ""):
            return _fail(errors, path, "This field may not be blank.")
        return super().clean(value, path, errors)

    def convert(self, value: Any, path: str, errors: Errors) -> Any:
        if type(value) is not str:
            return _fail(errors, path, "Not a valid string.")
        if self.trim:
            value = value.strip()
        messages = []
        if self.as_sent and (problem := names.as_sent_problem(value)) is not None:
            return _fail(errors, path, problem)
        if self.max_length is not None and len(value) > self.max_length:
            messages.append(f"Ensure this field has no more than {self.max_length} characters.")
        if self.min_length is not None and len(value) < self.min_length:
            messages.append(f"Ensure this field has at least {self.min_length} characters.")
        # NUL and lone surrogates never get here: the JSON parser refuses them first.
        if self._search is not None and not self._search(value):
            messages.append(self.pattern_message)
        return _fail(errors, path, *messages) if messages else value

    def field(self) -> drf_fields.AnyField:
        field = drf_fields.StrictCharField(
            min_length=self.min_length,
            max_length=self.max_length,
            trim_whitespace=self.trim,
            **self._options(),
        )
        if self.pattern:
            field.validators.append(RegexValidator(self.pattern, self.pattern_message))
        if self.as_sent:
            field.validators.append(_as_sent_validator)
        return field


def _as_sent_validator(value: str) -> None:
    problem = names.as_sent_problem(value)
    if problem is not None:
        raise serializers.ValidationError(problem)


def parse_uuid_text(value: Any) -> str | None:
    """A UUID given as a string, in its canonical spelling; None for anything else."""
    if type(value) is not str:
        return None
    try:
        return str(uuid.UUID(hex=value))
    except ValueError:
        return None


class Uuid(Rule):
    """A UUID string (braces, `urn:uuid:` and no dashes accepted), as canonical text."""

    def convert(self, value: Any, path: str, errors: Errors) -> Any:
        text = parse_uuid_text(value)
        if text is None:
            return _fail(errors, path, "Must be a valid UUID.")
        return text

    def field(self) -> drf_fields.AnyField:
        return UuidTextField(**self._options())


class UuidTextField(serializers.UUIDField):
    """The DRF field of a `Uuid` rule (the DLQ's bulk replay takes its ids with it)."""

    def to_internal_value(self, data: Any) -> str:  # type: ignore[override]
        text = parse_uuid_text(data)
        if text is None:
            self.fail("invalid", value=data)
        assert text is not None
        return text


_TIME_INVALID = str(drf_fields.TimeField.default_error_messages["invalid"])


class Time(Rule):
    """ISO 8601 with `Z` or an offset, up to year 9999."""

    def convert(self, value: Any, path: str, errors: Errors) -> Any:
        try:
            parsed: datetime = parse_time(value)
        except (ValueError, TypeError):
            return _fail(errors, path, _TIME_INVALID)
        return parsed

    def field(self) -> drf_fields.AnyField:
        return drf_fields.TimeField(**self._options())


class AnyJSON(Rule):
    """Any JSON value; `check` may refuse it by raising (the payload size limit: 413)."""

    def __init__(self, *, check: Callable[[Any], None] | None = None, **kw: Any):
        super().__init__(**kw)
        self.check = check

    def clean(self, value: Any, path: str, errors: Errors) -> Any:
        if value is None and not self.allow_null:
            return _fail(errors, path, "This field may not be null.")
        if self.check is not None:
            self.check(value)
        return value

    def field(self) -> drf_fields.AnyField:
        return drf_fields.AnyJSONField(**self._options())


class ListOf(Rule):
    """A JSON array of 1..`max_length` items, each checked by `item`.

    `length_first`: the length is checked before the items (DRF's nested
    serializers: `items`, `tasks`) rather than only when every item passed
    (DRF's ListField: `queues`).
    """

    def __init__(
        self,
        item: Rule,
        *,
        min_length: int | None = None,
        max_length: int | None = None,
        length_first: bool = False,
        **kw: Any,
    ):
        super().__init__(**kw)
        self.item = item
        self.min_length = min_length
        self.max_length = max_length
        self.length_first = length_first

    def _length(self, size: int) -> list[str]:
        messages = []
        if self.max_length is not None and size > self.max_length:
            messages.append(f"Ensure this field has no more than {self.max_length} elements.")
        if self.min_length is not None and size < self.min_length:
            messages.append(f"Ensure this field has at least {self.min_length} elements.")
        return messages

    def convert(self, value: Any, path: str, errors: Errors) -> Any:
        if type(value) is not list:
            return _fail(
                errors, path, f'Expected a list of items but got type "{type(value).__name__}".'
            )
        if not value:
            return _fail(errors, path, "This list may not be empty.")
        if self.length_first:
            messages = self._length(len(value))
            if messages:
                return _fail(errors, path, messages[0])
        item = self.item
        result = [item.clean(each, f"{path}[{index}]", errors) for index, each in enumerate(value)]
        if any(each is _BAD for each in result):
            return _BAD
        if not self.length_first:
            messages = self._length(len(value))
            if messages:
                return _fail(errors, path, *messages)
        return result

    def field(self) -> drf_fields.AnyField:
        # A ListField also for a list of objects (DRF would nest `many=True`): the
        # document then states its minItems and maxItems.
        return serializers.ListField(
            child=self.item.field(),
            min_length=self.min_length,
            max_length=self.max_length,
            allow_empty=False,
            **self._options(),
        )


class Obj(Rule):
    """A JSON object with these fields and no others; `check` sees the cleaned object.

    `check` returns `(field, message)` for a rule across fields, or None.
    """

    def __init__(
        self,
        name: str,
        fields: Mapping[str, Rule],
        *,
        check: Callable[[dict[str, Any]], tuple[str, str] | None] | None = None,
        **kw: Any,
    ):
        super().__init__(**kw)
        self.name = name
        self.fields = dict(fields)
        self.check = check
        self._serializer: type[drf_fields.StrictSerializer] | None = None

    def validate(self, data: Any) -> dict[str, Any]:
        """The cleaned body.  Raises: Invalid (400), PayloadTooLarge (413)."""
        errors: Errors = {}
        if data is None:
            raise Invalid({NON_FIELD: ["No data provided"]})
        cleaned = self.clean(data, "", errors)
        if cleaned is _BAD:
            raise Invalid(errors)
        result: dict[str, Any] = cleaned
        return result

    def convert(self, value: Any, path: str, errors: Errors) -> Any:
        if type(value) is not dict:
            return _fail(errors, path, "Expected a JSON object.")
        prefix = f"{path}." if path else ""
        fields = self.fields
        unknown = [name for name in value if name not in fields]
        if unknown:
            for name in sorted(unknown):
                errors[prefix + name] = ["Unknown field."]
            return _BAD
        cleaned: dict[str, Any] = {}
        bad = False
        for name, rule in fields.items():
            given = value.get(name, MISSING)
            if given is MISSING:
                if rule.required:
                    bad = True
                    errors[prefix + name] = ["This field is required."]
                elif rule.default is not MISSING:
                    cleaned[name] = rule.default
                continue
            result = rule.clean(given, prefix + name, errors)
            if result is _BAD:
                bad = True
            else:
                cleaned[name] = result
        if bad:
            return _BAD
        if self.check is not None:
            broken = self.check(cleaned)
            if broken is not None:
                return _fail(errors, prefix + broken[0], broken[1])
        return cleaned

    def serializer(self) -> type[drf_fields.StrictSerializer]:
        """The serializer class that describes this object (named `name`) to the schema."""
        if self._serializer is None:
            attrs: dict[str, Any] = {name: rule.field() for name, rule in self.fields.items()}
            attrs["__module__"] = __name__
            self._serializer = type(self.name, (drf_fields.StrictSerializer,), attrs)
        return self._serializer

    def field(self) -> drf_fields.AnyField:
        return self.serializer()(**self._options())
