"""Filter forms of the dashboard lists (GET query strings, validated)."""

from __future__ import annotations

import uuid
from typing import Any

from django import forms

from queues.models import Queue
from taskforge.audit.models import Action
from tasks.models import TaskStatus

# <input type="datetime-local"> sends `2024-05-01T10:00`; times are UTC.
TIME_FORMATS = ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"]


class _TimeInput(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self) -> None:
        super().__init__(format="%Y-%m-%dT%H:%M")


def _time_field(label: str) -> forms.DateTimeField:
    return forms.DateTimeField(
        required=False, label=label, input_formats=TIME_FORMATS, widget=_TimeInput()
    )


class QueueChoiceField(forms.ModelChoiceField[Queue]):
    """A queue by name (the URL reads `?queue=emails`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            queryset=Queue.objects.order_by("name"),
            to_field_name="name",
            required=False,
            empty_label="All queues",
            **kwargs,
        )


class TaskSearchForm(forms.Form):
    id = forms.CharField(
        required=False,
        label="Task id",
        max_length=64,
        widget=forms.TextInput(attrs={"placeholder": "Task id (UUID)", "autocomplete": "off"}),
    )
    queue = QueueChoiceField()
    status = forms.ChoiceField(
        required=False, choices=[("", "Any status"), *TaskStatus.choices], label="Status"
    )
    worker = forms.CharField(
        required=False,
        max_length=200,
        label="Worker id",
        widget=forms.TextInput(attrs={"placeholder": "Worker id"}),
    )
    created_after = _time_field("Created after (UTC)")
    created_before = _time_field("Created before (UTC)")
    # Taken as sent, as the API takes a fairness key.
    fairness_key = forms.CharField(
        required=False,
        max_length=200,
        strip=False,
        label="Fairness key",
        widget=forms.TextInput(attrs={"placeholder": "Fairness key"}),
    )
    cursor = forms.CharField(required=False, widget=forms.HiddenInput, max_length=500)

    def clean_id(self) -> uuid.UUID | None:
        raw = self.cleaned_data["id"].strip()
        if not raw:
            return None
        try:
            return uuid.UUID(raw)
        except ValueError as exc:
            raise forms.ValidationError("Not a task id: task ids are UUIDs.") from exc


class DlqFilterForm(forms.Form):
    queue = QueueChoiceField()
    died_after = _time_field("Died after (UTC)")
    died_before = _time_field("Died before (UTC)")
    cursor = forms.CharField(required=False, widget=forms.HiddenInput, max_length=500)


class AuditFilterForm(forms.Form):
    action = forms.ChoiceField(
        required=False, choices=[("", "Any action"), *Action.choices], label="Action"
    )
    actor = forms.CharField(
        required=False,
        max_length=200,
        strip=False,  # names match exactly, as in GET /audit
        label="Who",
        widget=forms.TextInput(attrs={"placeholder": "User, key name or manage.py"}),
    )
    # Free text, not a list of queues: a deleted queue's history stays searchable.
    queue = forms.CharField(
        required=False,
        max_length=100,
        strip=False,
        label="Queue",
        widget=forms.TextInput(attrs={"placeholder": "Queue name"}),
    )
    after = _time_field("After (UTC)")
    before = _time_field("Before (UTC)")
    cursor = forms.CharField(required=False, widget=forms.HiddenInput, max_length=500)
