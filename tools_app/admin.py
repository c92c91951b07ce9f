"""Admin for tools, tool sets, MCP servers, sandbox policies and secrets (values write-only).

Tenant admins are not trusted with the host (ARCHITECTURE §7): for them the command, arguments,
environment, network and read-only paths of MCP servers are read-only, and every save goes
through the owner operation `mcp.sync.save_server`, which refuses what only an operator may
set, whatever the POST says.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages

from tenancy_app.admin import TenantScopedAdmin

from .mcp.sync import check_server_change, save_server
from .models import MCPServer, SandboxPolicy, Secret, Tool, ToolSet
from .secrets import set_secret


@admin.register(ToolSet)
class ToolSetAdmin(TenantScopedAdmin):
    list_display = ["name", "tenant", "is_default", "description"]
    list_filter = ["is_default"]
    search_fields = ["name", "description"]


@admin.register(Tool)
class ToolAdmin(TenantScopedAdmin):
    list_display = ["name", "tenant", "source", "mcp_server", "risk", "read_only", "enabled", "readiness"]
    list_filter = ["source", "risk", "enabled", "readiness"]
    search_fields = ["name", "description", "remote_name"]
    filter_horizontal = ["toolsets"]
    readonly_fields = [
        "source",
        "mcp_server",
        "remote_name",
        "declared_hints",
        "readiness",
        "readiness_reason",
    ]
    fields = [
        "tenant",
        "name",
        "description",
        "input_schema",
        "risk",
        "read_only",
        "idempotent",
        "enabled",
        "toolsets",
        *readonly_fields,
    ]

    def save_model(self, request, obj, form, change):
        hints = obj.declared_hints or {}
        if change and hints.get("readOnlyHint") is False and obj.read_only:
            messages.warning(
                request, f"{obj.name}: marked read-only although its server does not declare it so."
            )
        super().save_model(request, obj, form, change)


class MCPServerForm(forms.ModelForm):
    by_operator = False  # set per request by MCPServerAdmin.get_form
    url = forms.URLField(
        required=False, max_length=500, assume_scheme="https", help_text="Streamable HTTP endpoint"
    )

    class Meta:
        model = MCPServer
        fields = [
            "tenant",
            "name",
            "transport",
            "command",
            "args",
            "env",
            "network_enabled",
            "sandbox_read_paths",
            "url",
            "headers",
            "timeout_seconds",
            "enabled",
        ]

    def _post_clean(self):
        super()._post_clean()  # the instance now carries the submitted values
        try:
            check_server_change(self.instance, by_operator=self.by_operator)
        except ValueError as exc:
            self.add_error(None, str(exc))


# What shapes the host process of a stdio server: operator-only.
STDIO_FIELDS = ["command", "args", "env", "network_enabled", "sandbox_read_paths"]


@admin.register(MCPServer)
class MCPServerAdmin(TenantScopedAdmin):
    form = MCPServerForm
    list_display = [
        "name",
        "tenant",
        "transport",
        "enabled",
        "configured_by_operator",
        "network_enabled",
        "status",
        "last_refreshed_at",
        "short_error",
    ]
    list_filter = ["transport", "status", "enabled"]
    search_fields = ["name", "url", "command"]
    readonly_fields = [
        "status",
        "last_error",
        "last_refreshed_at",
        "disabled_reason",
        "configured_by_operator",
    ]
    actions = ["test_and_refresh"]

    def get_readonly_fields(self, request, obj=None):
        fields = list(self.readonly_fields)
        if not request.user.is_superuser:
            # A stdio command runs on the host: only operators set it (the owner operation refuses anyway).
            fields += STDIO_FIELDS
            if obj is not None and obj.is_stdio:
                fields.append("transport")
        return fields

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        form.by_operator = request.user.is_superuser
        return form

    def save_model(self, request, obj, form, change):
        save_server(obj, by_operator=request.user.is_superuser)

    @admin.display(description="last error")
    def short_error(self, obj):
        return (obj.disabled_reason or obj.last_error or "")[:80]

    @admin.action(description="Test connection and refresh tools")
    def test_and_refresh(self, request, queryset):
        from .mcp.client import MCPError
        from .mcp.sync import refresh_server

        for server in queryset:
            try:
                result = refresh_server(server)
            except MCPError as exc:
                self.message_user(request, f"{server.name}: {exc}", level=messages.ERROR)
                continue
            names = ", ".join(t.name for t in result.tools) or "no tools"
            self.message_user(request, f"{server.name}: connected; {len(result.tools)} tool(s): {names}")


@admin.register(SandboxPolicy)
class SandboxPolicyAdmin(TenantScopedAdmin):
    list_display = [
        "name",
        "tenant",
        "filesystem",
        "network",
        "cpu_seconds",
        "memory_mb",
        "wall_seconds",
        "max_processes",
        "fallback",
        "is_default",
    ]


class SecretForm(forms.ModelForm):
    value = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        required=False,
        help_text="Write-only: stored encrypted and never shown again. Leave empty to keep the current value.",
    )

    class Meta:
        model = Secret
        fields = ["tenant", "name", "value"]

    def clean(self):
        cleaned = super().clean()
        if not self.instance.pk and not cleaned.get("value"):
            raise forms.ValidationError("A new secret needs a value.")
        return cleaned


@admin.register(Secret)
class SecretAdmin(TenantScopedAdmin):
    form = SecretForm
    list_display = ["name", "tenant", "updated_at"]
    search_fields = ["name"]

    def get_readonly_fields(self, request, obj=None):
        return ["tenant", "name"] if obj is not None else []

    def save_model(self, request, obj, form, change):
        value = form.cleaned_data.get("value")
        if value:
            saved = set_secret(obj.tenant, obj.name, value)
            obj.pk = saved.pk
        elif not change:
            raise forms.ValidationError("A new secret needs a value.")
