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
from .secrets import SECRET_REF, set_secret

SHELL_ENV_HELP = (
    "Environment variables that shell_exec gets in every Session that has this tool set (attached "
    "by default, by a person, or selected by the model), as a JSON object of NAME: value, e.g. "
    '{"API_TOKEN": "{{secret:API_TOKEN}}", "API_URL": "https://api.example.com"}. '
    "{{secret:NAME}} is replaced by the tenant secret NAME (see Secrets) when the command runs: this "
    "is the only place a secret reaches a shell command; the model can never reference one. The "
    "model sees the variable names, not the values, and cannot override them. Output, files, "
    "deliveries and previews that show a value are redacted, but a program given a secret can "
    "always leak a transformed copy: bind a secret only to a tool set whose Sessions need it."
)


class ToolSetForm(forms.ModelForm):
    class Meta:
        model = ToolSet
        fields = ["tenant", "name", "description", "is_default", "shell_env"]
        help_texts = {"shell_env": SHELL_ENV_HELP}


@admin.register(ToolSet)
class ToolSetAdmin(TenantScopedAdmin):
    form = ToolSetForm
    list_display = ["name", "tenant", "is_default", "shell_variables", "description"]
    list_filter = ["is_default"]
    search_fields = ["name", "description"]
    fields = ToolSetForm.Meta.fields

    @admin.display(description="shell environment")
    def shell_variables(self, obj):
        return ", ".join(sorted(obj.shell_env or {})) or "—"

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if obj.tenant_id is None:
            return  # a global tool set's references resolve in each tenant's own secrets
        wanted = {ref for value in (obj.shell_env or {}).values() for ref in SECRET_REF.findall(str(value))}
        have = set(
            Secret.objects.filter(tenant_id=obj.tenant_id, name__in=wanted).values_list("name", flat=True)
        )
        if wanted - have:
            messages.warning(
                request,
                f"{obj.name}: the shell environment references secrets this tenant has not set "
                f"({', '.join(sorted(wanted - have))}); shell_exec refuses to run in its Sessions until "
                "they are set.",
            )


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
        label="URL",
        required=False,
        max_length=500,
        assume_scheme="https",
        help_text="Streamable HTTP endpoint",
    )
    oauth_client_metadata_url = forms.URLField(
        required=False,
        max_length=500,
        assume_scheme="https",
        label="OAuth client metadata URL",
        help_text="Client ID metadata document: an https URL used as the client_id.",
    )
    oauth_issuer = forms.URLField(
        required=False,
        max_length=500,
        assume_scheme="https",
        label="OAuth issuer",
        help_text=MCPServer._meta.get_field("oauth_issuer").help_text,
    )
    oauth_client_secret = forms.CharField(
        widget=forms.PasswordInput(render_value=False),
        required=False,
        label="OAuth client secret",
        help_text="Pre-registered or client-credentials clients. Write-only: stored encrypted and never "
        "shown again. Leave empty to keep the current value.",
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
            "auth_mode",
            "oauth_scopes",
            "oauth_client_registration",
            "oauth_client_metadata_url",
            "oauth_client_id",
            "oauth_token_endpoint_auth_method",
            "oauth_issuer",
        ]

    # Choices with a default: a form (or a hand-made POST) that leaves them out keeps today's
    # behaviour (no OAuth) instead of failing.
    DEFAULTED = ("auth_mode", "oauth_client_registration", "oauth_token_endpoint_auth_method")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in self.DEFAULTED:
            if name in self.fields:
                self.fields[name].required = False

    def clean(self):
        cleaned = super().clean()
        for name in self.DEFAULTED:
            if name in self.fields and not cleaned.get(name):
                cleaned[name] = getattr(self.instance, name, None) or MCPServer._meta.get_field(name).default
        return cleaned

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
        "authorization",
        "last_refreshed_at",
        "short_error",
    ]
    list_filter = ["transport", "status", "enabled"]
    search_fields = ["name", "url", "command"]
    readonly_fields = [
        "status",
        "authorization",
        "last_error",
        "last_refreshed_at",
        "disabled_reason",
        "configured_by_operator",
    ]
    actions = ["test_and_refresh"]
    change_form_template = "admin/tools_app/mcpserver/change_form.html"

    @admin.display(description="authorization")
    def authorization(self, obj):
        from .mcp.oauth import AuthorizationStatus, authorization_status

        if obj is None or obj.pk is None:
            return "-"
        return AuthorizationStatus.LABELS[authorization_status(obj)]

    def get_urls(self):
        from django.urls import path

        wrap = self.admin_site.admin_view
        return [
            path(
                "<path:object_id>/oauth/connect/",
                wrap(self.oauth_connect),
                name="tools_app_mcpserver_connect",
            ),
            path(
                "<path:object_id>/oauth/revoke/", wrap(self.oauth_revoke), name="tools_app_mcpserver_revoke"
            ),
            *super().get_urls(),
        ]

    def _server_for_oauth(self, request, object_id):
        """The server, if this admin may change it (another tenant's is a 404); POST only."""
        from django.http import Http404

        server = self.get_object(request, object_id)
        if server is None or not self.has_change_permission(request, server):
            raise Http404("No such MCP server.")
        return server

    def _back_to(self, server):
        from django.shortcuts import redirect

        return redirect("admin:tools_app_mcpserver_change", server.pk)

    def oauth_connect(self, request, object_id):
        """Connect: the authorization server's page for an admin (authorization code), or a token
        fetched here (client credentials)."""
        from django.http import HttpResponseNotAllowed, HttpResponseRedirect

        from .mcp.oauth import connect_server

        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        server = self._server_for_oauth(request, object_id)
        started = connect_server(server, request.user, base_url=request.build_absolute_uri("/"))
        if started.authorization_url:
            return HttpResponseRedirect(started.authorization_url)
        self.message_user(request, started.message, level=messages.SUCCESS if started.ok else messages.ERROR)
        return self._back_to(server)

    def oauth_revoke(self, request, object_id):
        from django.http import HttpResponseNotAllowed

        from .mcp.oauth import do_revoke

        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        server = self._server_for_oauth(request, object_id)
        revocation = do_revoke(server, request.user)
        if revocation.had_tokens:
            self.message_user(
                request,
                f"{server.name}: authorization revoked; its stored tokens are deleted, and "
                f"{revocation.upstream}.",
                level=messages.SUCCESS if revocation.upstream_ok else messages.WARNING,
            )
        else:
            self.message_user(
                request, f"{server.name}: there was no stored authorization.", level=messages.WARNING
            )
        return self._back_to(server)

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
        from .mcp.oauth import set_client_secret

        if form.cleaned_data.get("oauth_client_secret"):
            set_client_secret(obj, form.cleaned_data["oauth_client_secret"])
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
    """Tenant admins narrow limits and may switch egress on; what lets a command out of the sandbox
    (`SandboxPolicy.OPERATOR_FIELDS`: the rlimits-only fallback, the host's network) exists only
    for superusers: a tenant admin neither sees nor posts it."""

    list_display = [
        "name",
        "tenant",
        "filesystem",
        "network",
        "cpu_seconds",
        "memory_mb",
        "wall_seconds",
        "max_processes",
        "is_default",
    ]
    operator_list_display = ["fallback", "host_network", "configured_by_operator"]

    def get_list_display(self, request):
        extra = self.operator_list_display if request.user.is_superuser else []
        return [*self.list_display, *extra]

    def get_exclude(self, request, obj=None):
        return [] if request.user.is_superuser else list(SandboxPolicy.OPERATOR_FIELDS)

    # What each limit means, and how far the operator lets it go (XAGENT_SANDBOX_MAX_*).
    LIMIT_HELP = {
        "cpu_seconds": "CPU seconds per process.",
        "memory_mb": "Address space per process, in MB; also the size of the sandbox's /tmp.",
        "wall_seconds": "Wall-clock seconds for one command.",
        "max_processes": "Processes (and threads) the sandbox may run at once.",
        "max_file_size_mb": "Largest file the sandbox may write, in MB.",
        "max_output_bytes": "Bytes of stdout and of stderr kept for the result.",
    }

    def get_form(self, request, obj=None, change=False, **kwargs):
        from django.conf import settings

        from .sandbox.policy import INT_BOUNDS

        form = super().get_form(request, obj, change=change, **kwargs)
        for name, text in self.LIMIT_HELP.items():
            if name in form.base_fields:
                ceiling = settings.XAGENT_SANDBOX_CEILINGS.get(name)
                field = form.base_fields[name]
                field.help_text = f"{text} At most {ceiling:,} (the operator's ceiling)."
                field.widget.attrs.update(min=INT_BOUNDS[name][0], max=ceiling)
        return form

    def get_readonly_fields(self, request, obj=None):
        return ["configured_by_operator"] if request.user.is_superuser else []

    def save_model(self, request, obj, form, change):
        obj.save(by_operator=request.user.is_superuser)


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
