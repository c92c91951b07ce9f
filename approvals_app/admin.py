"""Django admin for approvals: tenant admins manage their policies (rules inline), try a call
against them ("Test a call"), and read — never edit — pending approvals.

"Test a call" takes the tool's risk, tool sets and source from the tool catalog (through
`policy.tool_facts`, which tools_app registers), never from the form, so it shows what the
runtime would do with the same call.

Deciding an approval wakes its Session, so it is served by sessions_app's edge, not here
(ARCHITECTURE §10).
"""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template import engines
from django.template.response import TemplateResponse
from django.urls import path

from tenancy_app.access import admin_tenant_ids
from tenancy_app.admin import ReadOnlyTenantScopedAdmin, TenantScopedAdmin
from tenancy_app.models import Tenant

from .choices import ApprovalStatus
from .models import PendingApproval
from .policy import evaluate, rule_vocabulary, tool_facts
from .policy_models import ApprovalPolicy, ApprovalRule
from .rule_widgets import ApprovalRuleForm

# Kept inline so the admin ships as one module; they only extend Django's own admin templates.
_CHANGE_LIST = """{% extends "admin/change_list.html" %}
{% block object-tools-items %}
<li><a href="{% url 'admin:approvals_app_approvalpolicy_test' %}">Test a call</a></li>
{{ block.super }}
{% endblock %}"""

_CHANGE_FORM = """{% extends "admin/change_form.html" %}
{% block content %}{{ block.super }}
<datalist id="approval-tool-names">{% for name in rule_tool_names %}<option value="{{ name }}">{% endfor %}</datalist>
<datalist id="approval-toolset-names">{% for name in rule_toolset_names %}<option value="{{ name }}">{% endfor %}</datalist>
{% endblock %}"""

_TEST_CALL = """{% extends "admin/base_site.html" %}
{% block breadcrumbs %}<div class="breadcrumbs">
<a href="{% url 'admin:index' %}">Home</a> &rsaquo;
<a href="{% url 'admin:app_list' app_label=opts.app_label %}">{{ opts.app_config.verbose_name }}</a> &rsaquo;
<a href="{% url 'admin:approvals_app_approvalpolicy_changelist' %}">{{ opts.verbose_name_plural|capfirst }}</a>
&rsaquo; {{ title }}</div>{% endblock %}
{% block content %}
<p>Which rule would match this call? Nothing runs; the tenant's enabled policies are evaluated.
The tool's risk, tool sets and source come from the tool catalog, as at run time.</p>
<form method="post">{% csrf_token %}
<table>{{ form.as_table }}</table>
<div class="submit-row"><input type="submit" class="default" value="Evaluate"></div>
</form>
{% if verdict %}
<h2 id="verdict">Verdict: {{ verdict.action }}</h2>
<table>
<tr><th>Tool</th><td id="facts">{{ facts.name }}: risk {{ facts.risk }}, source {{ facts.source }}{% if facts.server %}
(server {{ facts.server }}, remote tool {{ facts.remote_name }}){% endif %}, tool sets
{{ facts.toolsets|join:", "|default:"none" }}</td></tr>
<tr><th>Matched rule</th><td>{% if verdict.rule %}#{{ verdict.rule.id }} in policy
“{{ verdict.rule.policy }}” (position {{ verdict.rule.position }}): {{ verdict.rule.label }}
{% else %}none{% endif %}</td></tr>
<tr><th>Reason</th><td>{{ verdict.reason }}</td></tr>
{% if verdict.rule %}
<tr><th>Who may decide</th><td>{{ deciders }}</td></tr>
<tr><th>Expires after</th><td>{% if verdict.expires_after_hours %}{{ verdict.expires_after_hours }} h
{% else %}never{% endif %}</td></tr>
{% endif %}
</table>
{% endif %}
{% endblock %}"""


def _template(source: str):
    return engines["django"].from_string(source)


def _is_tenant_admin(request) -> bool:
    user = request.user
    if user.is_superuser:
        return True
    cache_attr = "_xagent_admin_tenant_ids"  # the same per-request cache TenantScopedAdmin uses
    if not hasattr(request, cache_attr):
        setattr(request, cache_attr, admin_tenant_ids(user))
    return user.is_active and user.is_staff and bool(getattr(request, cache_attr))


class ApprovalRuleInline(admin.StackedInline):
    """One rule per block, in plain fields: which calls (tool picker, tool set, risk, source,
    argument condition rows), then what happens (action, who decides, expiry, reason). The JSON
    of conditions and deciders sits behind "Advanced"."""

    model = ApprovalRule
    form = ApprovalRuleForm
    extra = 1
    fieldsets = [
        (None, {"fields": [("position", "enabled")]}),
        ("Which calls", {"fields": [("tool_glob", "toolset"), ("risk", "source"), "argument_conditions"]}),
        ("What happens", {"fields": [("action", "expires_after_hours"), "deciders", "reason"]}),
    ]

    # Rules follow their policy: whoever may manage the (already tenant-scoped) policy manages its rules.
    def has_view_permission(self, request, obj=None):
        return _is_tenant_admin(request)

    def has_add_permission(self, request, obj=None):
        return _is_tenant_admin(request)

    def has_change_permission(self, request, obj=None):
        return _is_tenant_admin(request)

    def has_delete_permission(self, request, obj=None):
        return _is_tenant_admin(request)


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(TenantScopedAdmin):
    list_display = ["name", "tenant", "priority", "enabled", "rule_count", "created_at"]
    list_filter = ["enabled", ("tenant", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["name", "description"]
    fields = ["tenant", "name", "description", "priority", "enabled"]
    inlines = [ApprovalRuleInline]

    @property
    def change_list_template(self):
        return _template(_CHANGE_LIST)

    @property
    def change_form_template(self):
        return _template(_CHANGE_FORM)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        # The rule editor suggests the names of the policy's tenant (or the admin's tenants).
        tenant_ids = [obj.tenant_id] if obj is not None else self._tenant_ids(request)
        context["rule_tool_names"], context["rule_toolset_names"] = rule_vocabulary(tenant_ids)
        return super().render_change_form(request, context, add, change, form_url, obj)

    @admin.display(description="rules")
    def rule_count(self, obj):
        return obj.rules.count()

    def save_formset(self, request, form, formset, change):
        if formset.model is ApprovalRule:
            for rule in formset.save(commit=False):
                rule.tenant = form.instance.tenant
                rule.save()
            for rule in formset.deleted_objects:
                rule.delete()
            formset.save_m2m()
            return
        super().save_formset(request, form, formset, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        # A superuser may move a policy to another tenant; its rules move with it.
        form.instance.rules.exclude(tenant_id=form.instance.tenant_id).update(
            tenant_id=form.instance.tenant_id
        )

    def get_urls(self):
        custom = [
            path(
                "test/",
                self.admin_site.admin_view(self.test_call_view),
                name="approvals_app_approvalpolicy_test",
            )
        ]
        return custom + super().get_urls()

    def test_call_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        tenants = self._scoped(request, Tenant.objects.all())
        form = CallProbeForm(request.POST or None, tenants=tenants)
        verdict = facts = None
        if request.method == "POST" and form.is_valid():
            facts = form.cleaned_data["facts"]
            verdict = evaluate(form.cleaned_data["tenant"].pk, facts, form.cleaned_data["arguments"])
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Test a call",
            "form": form,
            "verdict": verdict,
            "facts": facts,
            "deciders": _describe_deciders(verdict.deciders) if verdict else "",
        }
        return TemplateResponse(request, _template(_TEST_CALL), context)


def _describe_deciders(deciders: dict) -> str:
    who = []
    if deciders.get("session_owner"):
        who.append("the session owner")
    if deciders.get("tenant_admins"):
        who.append("tenant admins")
    who.extend(f"role {role}" for role in deciders.get("roles", []))
    return ", ".join(who) or "nobody"


# A real native tool and arguments it takes (tests/approvals check both against the registry).
EXAMPLE_TOOL = "fs_delete_files"
EXAMPLE_ARGUMENTS = {"paths": ["draft_to_delete.md"]}


class CallProbeForm(forms.Form):
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none())
    name = forms.CharField(
        label="Tool name",
        max_length=200,
        initial=EXAMPLE_TOOL,
        help_text=f"as the model calls it, e.g. {EXAMPLE_TOOL} or an MCP server's tool as "
        "<server>__<tool> (example__add); risk, tool sets and source are the catalog's",
    )
    arguments = forms.JSONField(
        initial=EXAMPLE_ARGUMENTS,
        required=False,
        help_text=f"the call's arguments (a JSON object), e.g. {json.dumps(EXAMPLE_ARGUMENTS)}",
    )

    def __init__(self, *args, tenants, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tenant"].queryset = tenants
        if len(tenants) == 1:
            self.fields["tenant"].initial = tenants[0]

    def clean_arguments(self):
        arguments = self.cleaned_data.get("arguments")
        if arguments in (None, ""):
            return {}
        if not isinstance(arguments, dict):
            raise forms.ValidationError("Arguments must be a JSON object.")
        return arguments

    def clean(self):
        data = super().clean()
        tenant, name = data.get("tenant"), (data.get("name") or "").strip()
        if tenant is not None and name:
            facts = tool_facts(tenant.pk, name)
            if facts is None:
                self.add_error("name", f"{tenant} has no tool named {name!r}.")
            data["facts"] = facts
        return data


class ApprovalStatusFilter(admin.SimpleListFilter):
    """The list is "Pending approvals": it shows the pending ones unless another status (or all)
    is chosen, so its count is of what still waits for a person."""

    title = "status"
    parameter_name = "status"
    ALL = "all"

    def lookups(self, request, model_admin):
        return [*ApprovalStatus.choices, (self.ALL, "All")]

    def choices(self, changelist):
        for value, label in self.lookup_choices:
            yield {
                "selected": (self.value() or ApprovalStatus.PENDING) == value,
                "query_string": changelist.get_query_string({self.parameter_name: value}),
                "display": label,
            }

    def queryset(self, request, queryset):
        wanted = self.value() or ApprovalStatus.PENDING
        return queryset if wanted == self.ALL else queryset.filter(status=wanted)


@admin.register(PendingApproval)
class PendingApprovalAdmin(ReadOnlyTenantScopedAdmin):
    """Read-only: an approval is decided through sessions_app, which also resumes the Session."""

    list_display = ["tool", "session_id", "status", "risk", "requested_at", "decided_by", "decided_at"]
    list_filter = [ApprovalStatusFilter, "risk", ("tenant", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["tool", "call_id", "session_id"]
    readonly_fields = ["arguments_pretty"]

    @admin.display(description="arguments (redacted)")
    def arguments_pretty(self, obj):
        return json.dumps(obj.arguments_redacted, indent=2, sort_keys=True)

    def get_fields(self, request, obj=None):
        # Show the redacted arguments only: raw arguments may hold secrets the model echoed.
        return [
            "tenant",
            "session_id",
            "turn_id",
            "call_id",
            "tool",
            "tool_source",
            "risk",
            "reason",
            "rule",
            "arguments_pretty",
            "deciders",
            "status",
            "requested_by",
            "requested_at",
            "expires_at",
            "decided_by",
            "decided_at",
            "comment",
            "executed_at",
        ]

    def get_readonly_fields(self, request, obj=None):
        return self.get_fields(request, obj)
