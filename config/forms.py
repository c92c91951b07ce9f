"""Form fields shared by the admin."""

from __future__ import annotations

from django import forms

from .parsers import json_depth_exceeds, json_max_depth


class BoundedJSONField(forms.JSONField):
    """A JSON form field that refuses nesting deeper than XAGENT_JSON_MAX_DEPTH before parsing:
    `json.loads` of "[[[[…" ten thousand deep would raise RecursionError (a 500), and a tenant
    admin's form is input like any other."""

    def _too_deep(self, value) -> bool:
        return isinstance(value, str) and json_depth_exceeds(value, json_max_depth())

    def to_python(self, value):
        if self._too_deep(value):
            raise forms.ValidationError(
                f"This JSON is nested deeper than {json_max_depth()} levels.", code="too_deep"
            )
        return super().to_python(value)

    def bound_data(self, data, initial):
        if self._too_deep(data):
            return forms.fields.InvalidJSONInput(data)  # shown back as typed, with the error
        return super().bound_data(data, initial)
