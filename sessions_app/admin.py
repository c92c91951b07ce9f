"""Admin for model configurations (editable) and read-only views of Session evidence
(a projection: admins read it, only the runtime writes it)."""

from django import forms
from django.contrib import admin, messages
from django.http import Http404, HttpResponseRedirect
from django.template import engines
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from tenancy_app.admin import ReadOnlyTenantScopedAdmin, TenantScopedAdmin
from tenancy_app.crypto import encrypt
from tools_app.net import OutboundRefused, check_url
from tools_app.secrets import tenant_redactor

from . import quotas, usage
from .models import (
    Checkpoint,
    Delivery,
    GoalRun,
    Input,
    InputRequest,
    Memory,
    Message,
    ModelCall,
    ModelConfig,
    Quota,
    Session,
    SessionEvent,
    WorkerPresence,
)
from .runtime import engine
from .runtime.engine.goals import MAX_GOAL_CHARS
from .runtime.llm.connection_check import check_connection
from .runtime.llm.tokens import context_budget

# The least room a model configuration must leave for a request (the context budget).
MIN_REQUEST_TOKENS = 1024


class ModelConfigForm(forms.ModelForm):
    base_url = forms.URLField(
        label="Base URL", required=False, assume_scheme="https", help_text="e.g. https://api.openai.com/v1"
    )
    api_key = forms.CharField(
        label="API key",
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Write-only: stored encrypted, never shown. Leave empty to keep the current key.",
    )

    class Meta:
        model = ModelConfig
        fields = [
            "tenant",
            "name",
            "base_url",
            "api_key",
            "model",
            "context_window",
            "max_output_tokens",
            "temperature",
            "input_price",
            "cached_input_price",
            "output_price",
            "is_default",
        ]

    by_operator = False  # set per request by ModelConfigAdmin.get_form

    def _post_clean(self):
        super()._post_clean()  # the instance now carries the submitted base URL
        url = self.instance.base_url
        if self.by_operator or not url or not self.instance.operator_fields_changed():
            return
        try:
            check_url(url)  # again at every connect: this is for a clear message now
        except OutboundRefused as exc:
            self.add_error("base_url" if "base_url" in self.fields else None, str(exc))

    def clean(self):
        cleaned = super().clean()
        for name in ("input_price", "cached_input_price", "output_price"):
            if (cleaned.get(name) or 0) < 0:
                self.add_error(name, "must not be negative.")
        if (cleaned.get("input_price") is None) != (cleaned.get("output_price") is None):
            # Half a price would price half of every call: calls are priced with both or neither.
            self.add_error("output_price", "set both the input and the output price, or neither.")
        window, output = cleaned.get("context_window"), cleaned.get("max_output_tokens")
        if window is None or output is None:
            return cleaned  # the field's own error says what is missing
        if output < 1:
            self.add_error("max_output_tokens", "must be at least 1 (the room the model has to answer).")
        elif output >= window:
            raise forms.ValidationError("max_output_tokens must be smaller than context_window.")
        elif context_budget(window, output) < MIN_REQUEST_TOKENS:
            # A budget this small compacts at every step and still cannot fit a request.
            self.add_error(
                "max_output_tokens",
                f"leaves {context_budget(window, output)} tokens for the request (context window − "
                f"max output − margin); at least {MIN_REQUEST_TOKENS} are needed.",
            )
        return cleaned

    def save(self, commit=True):
        if self.cleaned_data.get("api_key"):
            self.instance.api_key_encrypted = encrypt(self.cleaned_data["api_key"])
        return super().save(commit)


@admin.register(ModelConfig)
class ModelConfigAdmin(TenantScopedAdmin):
    form = ModelConfigForm
    list_display = [
        "name",
        "tenant",
        "model",
        "base_url",
        "context_window",
        "max_output_tokens",
        "input_price",
        "output_price",
        "is_default",
        "has_key",
        "configured_by_operator",
    ]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), "is_default"]
    search_fields = ["name", "model"]
    readonly_fields = ["configured_by_operator"]

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        form.by_operator = request.user.is_superuser
        return form

    def save_model(self, request, obj, form, change):
        # A superuser vouches for the base URL; a tenant admin's new URL stays behind the outbound guard.
        obj.save(by_operator=request.user.is_superuser)

    @admin.display(boolean=True, description="API key set")
    def has_key(self, obj):
        return bool(obj.api_key_encrypted)

    actions = ["test_connections"]

    @property
    def change_form_template(self):
        return engines["django"].from_string(_MODEL_CONFIG_CHANGE_FORM)

    def get_urls(self):
        custom = [
            path(
                "<path:object_id>/test-connection/",
                self.admin_site.admin_view(self.test_connection_view),
                name="sessions_app_modelconfig_test_connection",
            )
        ]
        return custom + super().get_urls()

    def test_connection_view(self, request, object_id):
        """Asks the endpoint for its model list with the saved URL and key (through the outbound
        guard when a tenant admin set the URL) and shows the list or the error. A POST: it sends
        the key out. Only configurations this admin may change."""
        config = self.get_object(request, object_id)
        if config is None or not self.has_change_permission(request, config):
            raise Http404("No such model configuration.")
        check = check_connection(config) if request.method == "POST" else None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Test connection: {config.name}",
            "config": config,
            "check": check,
        }
        return TemplateResponse(request, engines["django"].from_string(_TEST_CONNECTION), context)

    @admin.action(description="Test connection of the selected model configurations")
    def test_connections(self, request, queryset):
        for config in queryset[:10]:  # each waits on a remote endpoint, up to 15 s
            check = check_connection(config)
            self.message_user(
                request, f"{config.name}: {check.summary}", messages.SUCCESS if check.ok else messages.ERROR
            )


_MODEL_CONFIG_CHANGE_FORM = """{% extends "admin/change_form.html" %}
{% block object-tools-items %}
{% if original.pk %}<li><a href="{% url 'admin:sessions_app_modelconfig_test_connection' original.pk %}"
 data-testid="test-connection">Test connection</a></li>{% endif %}
{{ block.super }}
{% endblock %}"""

_TEST_CONNECTION = """{% extends "admin/base_site.html" %}
{% block breadcrumbs %}<div class="breadcrumbs">
<a href="{% url 'admin:index' %}">Home</a> &rsaquo;
<a href="{% url 'admin:sessions_app_modelconfig_changelist' %}">{{ opts.verbose_name_plural|capfirst }}</a> &rsaquo;
<a href="{% url 'admin:sessions_app_modelconfig_change' config.pk %}">{{ config }}</a> &rsaquo; Test connection</div>
{% endblock %}
{% block content %}
<p>Asks <code>{{ config.base_url|default:"https://api.openai.com/v1" }}</code> for its model list with the
saved API key{% if not config.configured_by_operator %}, through the outbound guard (as a Session's calls
go){% endif %}. Save the form first: the test uses what is saved.</p>
<form method="post">{% csrf_token %}
<div class="submit-row"><input type="submit" class="default" value="Test connection"></div>
</form>
{% if check %}
{% if check.ok %}
<h2 id="connection-result" data-ok="true">Connected: {{ check.models|length|add:check.more_models }} model(s)</h2>
<p>{% if check.configured_model_offered %}The configured model <code>{{ check.configured_model }}</code>
is among them.{% else %}The configured model <code>{{ check.configured_model }}</code> is <strong>not</strong>
among them: check its name.{% endif %}</p>
<ul id="connection-models">{% for name in check.models %}<li><code>{{ name }}</code></li>{% endfor %}</ul>
{% if check.more_models %}<p>… and {{ check.more_models }} more.</p>{% endif %}
{% else %}
<h2 id="connection-result" data-ok="false">Not connected</h2>
<p class="errornote">{{ check.error }}</p>
{% endif %}
{% endif %}
{% endblock %}"""

_EDIT_GOALS = """{% extends "admin/base_site.html" %}
{% block breadcrumbs %}<div class="breadcrumbs">
<a href="{% url 'admin:index' %}">Home</a> &rsaquo;
<a href="{% url 'admin:sessions_app_session_changelist' %}">{{ opts.verbose_name_plural|capfirst }}</a> &rsaquo;
<a href="{% url 'admin:sessions_app_session_change' session.pk %}">{{ session }}</a> &rsaquo; {{ title }}</div>
{% endblock %}
{% block content %}
<p>The goals are the user's: the model never changes them. Every request of the Session states
both from its next step on; the Session's timeline notes the edit.</p>
<form method="post">{% csrf_token %}
<table>{{ form.as_table }}</table>
<div class="submit-row"><input type="submit" class="default" value="Save goals"></div>
</form>
{% endblock %}"""


class GoalsForm(forms.Form):
    session_goal = forms.CharField(
        required=False, max_length=MAX_GOAL_CHARS, widget=forms.Textarea(attrs={"rows": 3})
    )
    phase_goal = forms.CharField(
        required=False, max_length=MAX_GOAL_CHARS, widget=forms.Textarea(attrs={"rows": 3})
    )


@admin.register(Session)
class SessionAdmin(ReadOnlyTenantScopedAdmin):
    list_display = ["id", "title", "tenant", "owner", "kind", "parent", "status", "created_at", "archived_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), "status", "kind"]
    search_fields = ["title", "session_goal", "phase_goal"]
    readonly_fields = ["edit_goals"]

    @admin.display(description="goals")
    def edit_goals(self, obj):
        if obj is None or obj.pk is None:
            return ""
        return format_html(
            '<a href="{}">Edit the goals</a>', reverse("admin:sessions_app_session_goals", args=[obj.pk])
        )

    def get_urls(self):
        custom = [
            path(
                "<uuid:object_id>/goals/",
                self.admin_site.admin_view(self.goals_view),
                name="sessions_app_session_goals",
            )
        ]
        return custom + super().get_urls()

    def goals_view(self, request, object_id):
        """An admin's explicit edit of the goals (CONTRACT: the session goal changes only so),
        through SessionEngine like the API's PATCH. Only Sessions this admin sees."""
        session = self.get_queryset(request).filter(pk=object_id, archived_at__isnull=True).first()
        if session is None or not self.has_view_permission(request, session):
            raise Http404("No such Session.")
        initial = {"session_goal": session.session_goal, "phase_goal": session.phase_goal}
        form = GoalsForm(request.POST or None, initial=initial)
        if request.method == "POST" and form.is_valid():
            changed = {k: v for k, v in form.cleaned_data.items() if v != initial[k]}
            if changed:
                engine.update_goals(session.pk, **changed, by=request.user.get_username())
                self.message_user(request, "Goals saved.", messages.SUCCESS)
            return HttpResponseRedirect(reverse("admin:sessions_app_session_change", args=[session.pk]))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Edit the goals",
            "form": form,
            "session": session,
        }
        return TemplateResponse(request, engines["django"].from_string(_EDIT_GOALS), context)


@admin.register(Input)
class InputAdmin(ReadOnlyTenantScopedAdmin):
    list_display = ["id", "session", "kind", "status", "created_at", "consumed_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), "kind", "status"]


@admin.register(InputRequest)
class InputRequestAdmin(ReadOnlyTenantScopedAdmin):
    """Read-only audit of MCP servers' questions (elicitation): who answered what, and when;
    answered through the Session (browser, API, WebSocket), never here."""

    list_display = [
        "id",
        "session",
        "server",
        "tool",
        "status",
        "action",
        "answered_by",
        "requested_at",
        "answered_at",
    ]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), "status", "server"]
    search_fields = ["server", "tool", "call_id", "message"]


@admin.register(Message)
class MessageAdmin(ReadOnlyTenantScopedAdmin):
    list_display = ["id", "session", "role", "tool_name", "is_error", "created_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), "role"]


@admin.register(SessionEvent)
class SessionEventAdmin(ReadOnlyTenantScopedAdmin):
    list_display = ["session", "seq", "type", "created_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), "type"]
    ordering = ["-id"]  # the newest first, across Sessions (the primary key: indexed)


@admin.register(ModelCall)
class ModelCallAdmin(ReadOnlyTenantScopedAdmin):
    list_display = [
        "id",
        "session",
        "purpose",
        "model",
        "finish_reason",
        "attempts",
        "prompt_tokens",
        "cached_prompt_tokens",
        "completion_tokens",
        "cost",
        "latency_ms",
        "started_at",
    ]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), "purpose", "finish_reason", "model"]
    date_hierarchy = "started_at"

    def changelist_view(self, request, extra_context=None):
        """Above the list: usage totals of the calls it shows, by model and by user."""
        response = super().changelist_view(request, extra_context)
        changelist = getattr(response, "context_data", {}).get("cl")
        if changelist is not None:
            listed = changelist.queryset.order_by()
            response.context_data["usage_totals"] = [
                ("Model", usage.totals_of(listed, "model")),
                ("User", usage.totals_of(listed, "user")),
            ]
            response.context_data["usage_currency"] = usage.currency()
        return response


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyTenantScopedAdmin):
    """What completed turns delivered and what the product's own checks found."""

    list_display = ["id", "session", "turn", "file_count", "checks_passed", "unresolved", "created_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["final_answer"]

    def get_object(self, request, object_id, from_field=None):
        # Stored redacted; masked again for a row older than a secret (the page is read-only).
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            redactor = tenant_redactor(obj.tenant_id)
            if redactor:
                obj.final_answer = redactor.redact(obj.final_answer)
                obj.files = redactor.redact_data(obj.files)
                obj.checks = redactor.redact_data(obj.checks)
                obj.unresolved_failures = redactor.redact_data(obj.unresolved_failures)
        return obj

    @admin.display(description="files")
    def file_count(self, obj):
        return len(obj.files)

    @admin.display(boolean=True, description="checks ok")
    def checks_passed(self, obj):
        return obj.checks_ok

    @admin.display(description="unresolved failures")
    def unresolved(self, obj):
        return len(obj.unresolved_failures)


@admin.register(GoalRun)
class GoalRunAdmin(ReadOnlyTenantScopedAdmin):
    """Goal runs and the driver's decisions (only the goal driver writes them; people resume or
    stop a run from the API)."""

    list_display = [
        "id",
        "session",
        "status",
        "rounds_done",
        "max_rounds",
        "tokens_used",
        "token_budget",
        "last_decision",
        "started_at",
        "ended_at",
    ]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), "status", "last_decision"]
    search_fields = ["goal", "last_reason"]
    raw_id_fields = ["session", "round_input", "last_turn"]


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyTenantScopedAdmin):
    """Context compactions: where each cut the history, how (summary or trim) and what it saved."""

    list_display = [
        "id",
        "session",
        "status",
        "method",
        "covers_from_id",
        "covers_to_id",
        "tokens_before",
        "tokens_after",
        "budget",
        "created_at",
    ]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), "status", "method"]
    search_fields = ["reason"]


@admin.register(Memory)
class MemoryAdmin(ReadOnlyTenantScopedAdmin):
    """Users' long-term memories: admins read them (and may delete one, e.g. on request);
    only the memory tools write them."""

    list_display = ["short_text", "kind", "user", "tenant", "source_session", "updated_at"]
    list_filter = ["kind", ("tenant", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["text", "user__username"]
    list_select_related = ["user", "tenant"]
    raw_id_fields = ["source_session"]

    @admin.display(description="text")
    def short_text(self, obj):
        return obj.text if len(obj.text) <= 80 else obj.text[:79] + "…"

    def has_delete_permission(self, request, obj=None):
        return TenantScopedAdmin.has_delete_permission(self, request, obj)


@admin.register(WorkerPresence)
class WorkerPresenceAdmin(admin.ModelAdmin):
    """Which processes run slices and when each was last seen: infrastructure, so operators
    (superusers) only, and read-only — the processes themselves keep these rows."""

    list_display = ["holder", "host", "pid", "started_at", "seen_at"]
    search_fields = ["holder", "host"]

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_superuser

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class QuotaForm(forms.ModelForm):
    class Meta:
        model = Quota
        fields = ["tenant", "user", "period", "max_tokens", "max_cost"]

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("max_tokens") is None and cleaned.get("max_cost") is None:
            raise forms.ValidationError("Set a token limit, a cost limit, or both.")
        if (cleaned.get("max_cost") or 0) < 0:
            self.add_error("max_cost", "must not be negative.")
        tenant, user = cleaned.get("tenant"), cleaned.get("user")
        if tenant is not None and user is not None and not user.memberships.filter(tenant=tenant).exists():
            self.add_error("user", f"{user.get_username()} is not a member of {tenant}.")
        return cleaned


@admin.register(Quota)
class QuotaAdmin(TenantScopedAdmin):
    """Daily or monthly limits on tokens or cost, for a whole tenant or one member. Saving one
    resumes the Sessions parked for a spent quota (those still over it park again)."""

    form = QuotaForm
    list_display = ["__str__", "tenant", "user", "period", "max_tokens", "max_cost", "used_now", "updated_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), "period"]

    @admin.display(description="used this period")
    def used_now(self, obj):
        rule = quotas.QuotaRule(obj.pk, obj.user_id, obj.period, obj.max_tokens, obj.max_cost)
        spent = quotas.spent(obj.tenant_id, obj.user_id, [rule])
        return "spent" if spent is not None else "within the limit"
