"""Structured fields for an approval rule in admin: argument conditions as rows (path, regex,
negate) and deciders as checkboxes, with the stored JSON behind an "Advanced" disclosure.

Each widget posts its structured inputs plus a marker (`<name>__structured`). The JSON text
is the field's own input (`<name>`): it is what the form reads when the person ticks "use this
JSON instead", or when a request carries no marker at all (a script posting the JSON, as
before). Validation stays the model's (`ApprovalRule.clean`), so a bad row gets the same
message a bad JSON condition gets ("condition 2 needs a non-empty 'regex'").
"""

from __future__ import annotations

import json
import re

from django import forms
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from config.forms import BoundedJSONField
from config.parsers import json_depth_exceeds, json_max_depth
from tenancy_app.choices import Role

from .policy_models import MAX_CONDITIONS

# Empty condition rows offered below the rule's own (the admin's "Save and continue editing"
# gives more); a row left empty is ignored.
EMPTY_CONDITION_ROWS = 2
# One past the model's limit: a longer post fails validation with the limit named, never cut silently.
MAX_CONDITION_ROWS = MAX_CONDITIONS + 1


def _as_value(value):
    """The field's value as data (list/dict), or the raw text when it is not JSON (a bound form
    re-shown with the person's own unparseable JSON)."""
    if isinstance(value, forms.fields.InvalidJSONInput):
        return str(value)  # what the person typed, shown back with the field's error
    if isinstance(value, str):
        if json_depth_exceeds(value, json_max_depth()):
            return value
        try:
            return json.loads(value) if value.strip() else None
        except ValueError:
            return value
    return value


def _pretty(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)


def _advanced(name: str, value, attrs: dict, *, raw: bool) -> str:
    textarea_id = attrs.get("id", f"id_{name}")
    return format_html(
        '<details class="rule-advanced"{open}><summary>Advanced: JSON</summary>'
        '<textarea name="{name}" id="{id}" rows="4" cols="60" spellcheck="false">{text}</textarea>'
        '<label class="vCheckboxLabel"><input type="checkbox" name="{name}__as_json"{checked}> '
        "Use this JSON instead of the fields above</label></details>",
        open=mark_safe(" open") if raw else "",
        name=name,
        id=textarea_id,
        text=_pretty(value) if value is not None else "",
        checked=mark_safe(" checked") if raw else "",
    )


def _structured(data, name: str) -> bool:
    return f"{name}__structured" in data and not data.get(f"{name}__as_json")


class ConditionRowsWidget(forms.Widget):
    """`[{"path": …, "regex": …, "negate": true?}, …]` as table rows."""

    def render(self, name, value, attrs=None, renderer=None):
        attrs = attrs or {}
        value = _as_value(value)
        raw = isinstance(value, str) or (value is not None and not isinstance(value, list))
        rows = [c for c in (value if isinstance(value, list) else []) if isinstance(c, dict)]
        rows = rows + [{}] * EMPTY_CONDITION_ROWS
        body = format_html_join(
            "",
            '<tr data-testid="condition-row">'
            '<td><input type="text" name="{0}__path_{1}" value="{2}"{6} '
            'aria-label="Argument path of condition {3}" size="18"></td>'
            '<td><input type="text" name="{0}__regex_{1}" value="{4}"{7} '
            'aria-label="Regex of condition {3}" size="24"></td>'
            '<td><label><input type="checkbox" name="{0}__negate_{1}"{5}> must not match</label></td></tr>',
            (
                (
                    name,
                    index,
                    str(row.get("path", "")),
                    index + 1,
                    str(row.get("regex", "")),
                    mark_safe(" checked") if row.get("negate") is True else "",
                    # An example in the first row only: a column of greyed examples reads as rules.
                    mark_safe(' placeholder="e.g. paths[*]"') if index == 0 else "",
                    mark_safe(' placeholder="e.g. ^drafts/"') if index == 0 else "",
                )
                for index, row in enumerate(rows[:MAX_CONDITION_ROWS])
            ),
        )
        return format_html(
            '<div class="condition-rows" data-testid="condition-rows">'
            '<input type="hidden" name="{name}__structured" value="1">'
            "<table><thead><tr><th>Argument path</th><th>Regex (RE2)</th><th></th></tr></thead>"
            "<tbody>{body}</tbody></table>"
            '<p class="help">Every filled row must hold. <code>paths[*]</code> holds when any element '
            "matches; a path the call lacks never holds. An empty row is ignored; save to get more "
            "rows.</p>{advanced}</div>",
            name=name,
            body=body,
            advanced=_advanced(name, value if value is not None else [], attrs, raw=raw),
        )

    def value_from_datadict(self, data, files, name):
        if not _structured(data, name):
            return data.get(name)
        pattern = re.compile(rf"^{re.escape(name)}__(?:path|regex)_(\d+)$")
        indices = sorted({int(m.group(1)) for key in data if (m := pattern.match(key))})
        conditions = []
        for index in indices[:MAX_CONDITION_ROWS]:
            path = (data.get(f"{name}__path_{index}") or "").strip()
            regex = data.get(f"{name}__regex_{index}") or ""
            if not path and not regex:
                continue
            condition = {"path": path, "regex": regex}
            if data.get(f"{name}__negate_{index}"):
                condition["negate"] = True
            conditions.append(condition)
        return json.dumps(conditions)  # the form field (a JSONField) reads text

    def value_omitted_from_data(self, data, files, name):
        return f"{name}__structured" not in data and name not in data


DECIDER_FLAGS = (("session_owner", "the Session's owner"), ("tenant_admins", "the tenant's admins"))


class DecidersWidget(forms.Widget):
    """`{"session_owner": bool, "tenant_admins": bool, "roles": [...]}` as checkboxes."""

    def render(self, name, value, attrs=None, renderer=None):
        attrs = attrs or {}
        value = _as_value(value)
        raw = not isinstance(value, dict) and value not in (None, "")
        current = value if isinstance(value, dict) else {}
        roles = current.get("roles") if isinstance(current.get("roles"), list) else []
        boxes = [
            (name, key, mark_safe(" checked") if current.get(key) is True else "", label)
            for key, label in DECIDER_FLAGS
        ] + [
            (
                name,
                f"role_{role.value}",
                mark_safe(" checked") if role.value in roles else "",
                f"any {role.label.lower()} of the tenant",
            )
            for role in Role
        ]
        items = format_html_join(
            "",
            '<li><label><input type="checkbox" name="{0}__{1}"{2}> {3}</label></li>',
            boxes,
        )
        return format_html(
            '<div class="decider-choices" data-testid="decider-choices">'
            '<input type="hidden" name="{name}__structured" value="1">'
            '<ul class="checkbox-row" style="list-style:none;padding:0;margin:0">{items}</ul>'
            '<p class="help">Who may approve or reject (for “require approval” rules).</p>{advanced}</div>',
            name=name,
            items=items,
            advanced=_advanced(name, value if value is not None else {}, attrs, raw=raw),
        )

    def value_from_datadict(self, data, files, name):
        if not _structured(data, name):
            return data.get(name)
        chosen = {
            "session_owner": bool(data.get(f"{name}__session_owner")),
            "tenant_admins": bool(data.get(f"{name}__tenant_admins")),
            "roles": [role.value for role in Role if data.get(f"{name}__role_{role.value}")],
        }
        return json.dumps(chosen)

    def value_omitted_from_data(self, data, files, name):
        return f"{name}__structured" not in data and name not in data


class ApprovalRuleForm(forms.ModelForm):
    """A rule with structured fields; `tool_glob` and `toolset` suggest the tenant's names (the
    page's datalists) and still take any glob."""

    class Meta:
        fields = [
            "position",
            "enabled",
            "tool_glob",
            "toolset",
            "risk",
            "source",
            "argument_conditions",
            "action",
            "deciders",
            "expires_after_hours",
            "reason",
        ]
        widgets = {
            "argument_conditions": ConditionRowsWidget,
            "deciders": DecidersWidget,
            "tool_glob": forms.TextInput(attrs={"list": "approval-tool-names", "placeholder": "any tool"}),
            "toolset": forms.TextInput(attrs={"list": "approval-toolset-names", "placeholder": "any"}),
            "reason": forms.TextInput(attrs={"size": 60}),
        }
        field_classes = {"argument_conditions": BoundedJSONField, "deciders": BoundedJSONField}
        labels = {"tool_glob": "Tool", "toolset": "Tool set", "argument_conditions": "Arguments"}
        help_texts = {
            "tool_glob": "a tool's name, a glob (fs_*, *__add) or mcp:SERVER:TOOL; blank = any",
            "argument_conditions": "",  # the rows say it
            "deciders": "",
        }
