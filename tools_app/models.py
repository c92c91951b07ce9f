"""Tool facts: what tools exist (native, MCP), how they are grouped, which MCP servers
provide them, under which sandbox they run, and the secrets they may use.

Native tools are global rows (tenant NULL) mirrored from the code registry; everything an
admin adds belongs to one tenant. Reads go through `for_tenant`, which for these models
means "this tenant's rows plus the global ones".
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

from approvals_app.choices import Risk, ToolSource
from tenancy_app.models import TenantOrGlobalModel, TenantOwnedModel

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

name_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9_-]{0,47}$", "Use lowercase letters, digits, '_' or '-' (max 48)."
)


class Readiness(models.TextChoices):
    READY = "ready", "Ready"
    UNAVAILABLE = "unavailable", "Unavailable"


class OperatorConfigured(models.Model):
    """A row whose destination only an operator may vouch for (ARCHITECTURE §7, trust boundary).

    `configured_by_operator` is set only by operator paths (superusers in admin, manage.py),
    through `save(by_operator=True)`. Any other save that changes one of `OPERATOR_FIELDS`
    of a loaded row clears it, so the row falls back to the tenant rules (no stdio command,
    outbound guard on URLs). A bulk `.update()` is the one thing that bypasses this.
    """

    OPERATOR_FIELDS: tuple[str, ...] = ()

    configured_by_operator = models.BooleanField(
        default=False,
        editable=False,
        help_text="Set by an operator (superuser or manage.py): trusted with the host and the network.",
    )

    class Meta:
        abstract = True

    def save(self, *args, by_operator: bool = False, **kwargs):
        if by_operator:
            self.configured_by_operator = True
        elif (
            self.configured_by_operator
            and getattr(self, "_operator_snapshot", None) is not None
            and self.operator_fields_changed()
        ):
            self.configured_by_operator = False
        update_fields = kwargs.get("update_fields")
        if update_fields is not None:
            kwargs["update_fields"] = {*update_fields, "configured_by_operator"}
        super().save(*args, **kwargs)
        self._operator_snapshot = self._operator_values()

    @classmethod
    def from_db(cls, db, field_names, values):
        instance = super().from_db(db, field_names, values)
        instance._operator_snapshot = instance._operator_values()
        return instance

    def _operator_values(self) -> dict:
        return {name: getattr(self, name) for name in self.OPERATOR_FIELDS if name in self.__dict__}

    def operator_fields_changed(self) -> bool:
        """True for a new row, or a loaded one whose operator-only fields differ from the database."""
        snapshot = getattr(self, "_operator_snapshot", None)
        return snapshot is None or snapshot != self._operator_values()


class MCPServer(OperatorConfigured, TenantOwnedModel):
    OPERATOR_FIELDS = ("transport", "command", "args", "env", "url", "network_enabled", "sandbox_read_paths")

    class Transport(models.TextChoices):
        STDIO = "stdio", "stdio (local command)"
        STREAMABLE_HTTP = "streamable_http", "Streamable HTTP"

    class Status(models.TextChoices):
        UNKNOWN = "unknown", "Not checked yet"
        OK = "ok", "Connected"
        ERROR = "error", "Error"

    name = models.CharField(max_length=48, validators=[name_validator])
    transport = models.CharField(max_length=20, choices=Transport.choices)
    command = models.CharField(max_length=500, blank=True, help_text="stdio: the executable")
    args = models.JSONField(default=list, blank=True, help_text="stdio: list of arguments")
    env = models.JSONField(
        default=dict, blank=True, help_text="stdio: variables; values may be {{secret:NAME}}"
    )
    # How the stdio server's sandbox differs from the default (tools_app/mcp/stdio.py): operator-only.
    network_enabled = models.BooleanField(
        default=False, help_text="stdio: the server may use the host's network (operator only)."
    )
    sandbox_read_paths = models.JSONField(
        default=list,
        blank=True,
        help_text="stdio: absolute host paths the server may read, bound read-only at the same path "
        "(operator only).",
    )
    url = models.URLField("URL", max_length=500, blank=True, help_text="Streamable HTTP endpoint")
    headers = models.JSONField(
        default=dict, blank=True, help_text="HTTP headers; values may be {{secret:NAME}}"
    )
    timeout_seconds = models.PositiveIntegerField(default=30)
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(
        max_length=500, blank=True, editable=False, help_text="Why the product disabled this server."
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.UNKNOWN)
    last_error = models.TextField(blank=True)
    last_refreshed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    # --- authorization (Streamable HTTP only; mcp/oauth.py owns the OAuth flows) ---
    class AuthMode(models.TextChoices):
        NONE = "none", "None"
        HEADERS = "headers", "Static headers (an Authorization header in Headers)"
        OAUTH = "oauth", "OAuth: authorization code + PKCE (an admin connects it)"
        CLIENT_CREDENTIALS = "client_credentials", "OAuth: client credentials (machine to machine)"

    class ClientRegistration(models.TextChoices):
        DYNAMIC = "dynamic", "Dynamic client registration"
        METADATA_DOCUMENT = "metadata_document", "Client ID metadata document (URL)"
        PRE_REGISTERED = "pre_registered", "Pre-registered client ID (and secret)"

    class TokenEndpointAuth(models.TextChoices):
        CLIENT_SECRET_BASIC = "client_secret_basic", "client_secret_basic"
        CLIENT_SECRET_POST = "client_secret_post", "client_secret_post"
        NONE = "none", "none (public client)"

    auth_mode = models.CharField(max_length=20, choices=AuthMode.choices, default=AuthMode.NONE)
    oauth_scopes = models.CharField(
        "OAuth scopes",
        max_length=500,
        blank=True,
        help_text="Space-separated; used when the server names none (its challenge or metadata wins).",
    )
    oauth_client_registration = models.CharField(
        "OAuth client registration",
        max_length=20,
        choices=ClientRegistration.choices,
        default=ClientRegistration.DYNAMIC,
    )
    oauth_client_metadata_url = models.URLField(
        "OAuth client metadata URL",
        max_length=500,
        blank=True,
        help_text="Client ID metadata document: an https URL used as the client_id.",
    )
    oauth_client_id = models.CharField(
        "OAuth client ID", max_length=300, blank=True, help_text="Pre-registered client ID."
    )
    # Encrypted (tenancy_app.crypto); set through the admin's write-only field, never shown.
    oauth_client_secret_encrypted = models.TextField(blank=True, editable=False)
    oauth_token_endpoint_auth_method = models.CharField(
        "OAuth token endpoint auth method",
        max_length=20,
        choices=TokenEndpointAuth.choices,
        default=TokenEndpointAuth.CLIENT_SECRET_BASIC,
    )
    oauth_issuer = models.URLField(
        max_length=500,
        blank=True,
        help_text="Client credentials: the authorization server the client secret belongs to "
        "(recommended: the secret is then sent only there).",
    )

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="unique_mcp_server_name")]

    def __str__(self) -> str:
        return self.name

    @property
    def is_stdio(self) -> bool:
        return self.transport == self.Transport.STDIO

    @property
    def uses_oauth(self) -> bool:
        return self.transport == self.Transport.STREAMABLE_HTTP and self.auth_mode in (
            self.AuthMode.OAUTH,
            self.AuthMode.CLIENT_CREDENTIALS,
        )

    def clean(self):
        super().clean()
        if self.auth_mode != self.AuthMode.NONE and self.transport != self.Transport.STREAMABLE_HTTP:
            raise ValidationError({"auth_mode": "Authorization applies to Streamable HTTP servers only."})
        has_authorization_header = any(str(k).lower() == "authorization" for k in (self.headers or {}))
        if self.uses_oauth and has_authorization_header:
            raise ValidationError(
                {"headers": "An OAuth server gets its Authorization header from its tokens: remove it here."}
            )
        if self.auth_mode == self.AuthMode.CLIENT_CREDENTIALS and not self.oauth_client_id:
            raise ValidationError({"oauth_client_id": "Client credentials need a client ID (and secret)."})
        if (
            self.auth_mode == self.AuthMode.OAUTH
            and self.oauth_client_registration == self.ClientRegistration.PRE_REGISTERED
            and not self.oauth_client_id
        ):
            raise ValidationError({"oauth_client_id": "A pre-registered client needs its client ID."})
        if (
            self.auth_mode == self.AuthMode.OAUTH
            and self.oauth_client_registration == self.ClientRegistration.METADATA_DOCUMENT
            and not self.oauth_client_metadata_url.startswith("https://")
        ):
            raise ValidationError(
                {"oauth_client_metadata_url": "A client ID metadata document needs an https:// URL."}
            )


class ToolSet(TenantOrGlobalModel):
    name = models.CharField(max_length=48, validators=[name_validator])
    description = models.TextField(blank=True)
    is_default = models.BooleanField(default=False, help_text="Attached to every new Session.")
    # Written by an admin, never by the model: the one place a `{{secret:NAME}}` reaches a
    # `shell_exec` process (ARCHITECTURE §7, secrets only where an admin bound them).
    shell_env = models.JSONField(
        default=dict,
        blank=True,
        verbose_name="shell environment",
        help_text="Environment variables for shell_exec in Sessions that have this tool set, e.g. "
        '{"API_TOKEN": "{{secret:API_TOKEN}}"}. Values may reference tenant secrets; the model '
        "never can. Output that shows a value is redacted.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "tool set"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="unique_toolset_name"),
            models.UniqueConstraint(
                fields=["name"], condition=models.Q(tenant__isnull=True), name="unique_global_toolset_name"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self):
        super().clean()
        env = self.shell_env
        if env in (None, ""):
            self.shell_env = {}
            return
        if not isinstance(env, dict):
            raise ValidationError({"shell_env": "Give a JSON object of NAME: value strings."})
        for name, value in env.items():
            if not ENV_NAME.match(name):
                raise ValidationError({"shell_env": f"{name!r} is not a valid environment variable name."})
            if not isinstance(value, str) or "\x00" in value:
                raise ValidationError({"shell_env": f"The value of {name} must be a string without NUL."})


class Tool(TenantOrGlobalModel):
    """A tool the model may be offered. `name` is what the model sees (an OpenAI function name)."""

    name = models.CharField(max_length=64, validators=[RegexValidator(r"^[a-zA-Z0-9_-]{1,64}$")])
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)
    source = models.CharField(max_length=10, choices=ToolSource.choices, default=ToolSource.NATIVE)
    risk = models.CharField(max_length=12, choices=Risk.choices, default=Risk.READ)
    read_only = models.BooleanField(default=False)
    idempotent = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    readiness = models.CharField(max_length=12, choices=Readiness.choices, default=Readiness.READY)
    readiness_reason = models.CharField(max_length=500, blank=True)
    mcp_server = models.ForeignKey(
        MCPServer, null=True, blank=True, on_delete=models.CASCADE, related_name="tools"
    )
    remote_name = models.CharField(max_length=200, blank=True, help_text="The tool's name on its MCP server.")
    # What the server's annotations said, kept so an admin can tighten but see what was declared.
    declared_hints = models.JSONField(default=dict, blank=True)
    toolsets = models.ManyToManyField(ToolSet, blank=True, related_name="tools")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="unique_tool_name"),
            models.UniqueConstraint(
                fields=["name"], condition=models.Q(tenant__isnull=True), name="unique_global_tool_name"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self):
        super().clean()
        from .registry import NATIVE_TOOLS

        if self.source == ToolSource.NATIVE and self.name not in NATIVE_TOOLS:
            # A native row is the product's code; one without code would be a phantom tool.
            raise ValidationError(
                {
                    "name": f"There is no native tool named {self.name!r}: native tools come with the "
                    "product. Add tools through an MCP server instead."
                }
            )


class SandboxPolicy(OperatorConfigured, TenantOrGlobalModel):
    """Limits of the process sandbox for a tenant's `shell_exec` and stdio MCP servers.

    A tenant admin may narrow limits and switch on `network` (egress through the outbound guard's
    proxy from the sandbox's own network namespace). `fallback` and `host_network` let a command
    run outside parts of the sandbox: they are operator-only (`OPERATOR_FIELDS`), honoured only
    while `configured_by_operator` holds (see `effective_fallback` / `effective_host_network`).
    """

    OPERATOR_FIELDS = ("fallback", "host_network")

    class Filesystem(models.TextChoices):
        READ_ONLY = "read_only", "Read only"
        WORKSPACE_WRITE = "workspace_write", "Workspace writable"

    class Fallback(models.TextChoices):
        REFUSE = "refuse", "Refuse to run"
        RLIMITS_ONLY = "rlimits_only", "Run with resource limits only (logged)"

    name = models.CharField(max_length=48, validators=[name_validator])
    filesystem = models.CharField(
        max_length=20, choices=Filesystem.choices, default=Filesystem.WORKSPACE_WRITE
    )
    network = models.BooleanField(
        default=False,
        help_text="Egress to public addresses through the outbound guard (a proxy the sandbox reaches "
        "from its own network namespace): never loopback, private, link-local or metadata addresses "
        "unless the operator allow-lists them, and never the host's own network.",
    )
    host_network = models.BooleanField(
        default=False,
        verbose_name="host network (dangerous)",
        help_text="Operator only. DANGEROUS: commands share the host's network namespace and reach "
        "everything the host reaches (its database, Redis, the app's own port, internal networks). "
        "Never for a tenant's own policy.",
    )
    cpu_seconds = models.PositiveIntegerField(default=30)
    memory_mb = models.PositiveIntegerField(default=1024)
    wall_seconds = models.PositiveIntegerField(default=60)
    max_processes = models.PositiveIntegerField(default=64)
    max_file_size_mb = models.PositiveIntegerField(default=50)
    max_output_bytes = models.PositiveIntegerField(default=200_000)
    fallback = models.CharField(
        max_length=15,
        choices=Fallback.choices,
        default=Fallback.REFUSE,
        help_text="Operator only: where bubblewrap cannot start, refuse (always, for a tenant) or run "
        "with resource limits only.",
    )
    is_default = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "sandbox policies"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="unique_sandbox_policy_name"),
            models.UniqueConstraint(
                fields=["name"],
                condition=models.Q(tenant__isnull=True),
                name="unique_global_sandbox_policy_name",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self):
        super().clean()
        from .sandbox.policy import INT_BOUNDS

        errors = {}
        for name, (low, high) in INT_BOUNDS.items():
            value = getattr(self, name)
            ceiling = settings.XAGENT_SANDBOX_CEILINGS.get(name, high)
            if value is None:
                continue
            if value < low:
                errors[name] = f"At least {low}."
            elif value > min(high, ceiling):
                errors[name] = (
                    f"At most {min(high, ceiling)}: the operator's ceiling for every sandbox policy"
                    f" (XAGENT_SANDBOX_MAX_{name.upper().removeprefix('MAX_')})."
                    if ceiling < high
                    else f"At most {high}."
                )
        if errors:
            raise ValidationError(errors)

    @property
    def effective_fallback(self) -> str:
        """`fallback`, if an operator set it; a tenant's row always refuses."""
        return self.fallback if self.configured_by_operator else self.Fallback.REFUSE

    @property
    def effective_host_network(self) -> bool:
        return bool(self.host_network and self.configured_by_operator)

    def limits_kwargs(self) -> dict:
        return {
            field: getattr(self, field)
            for field in (
                "filesystem",
                "network",
                "cpu_seconds",
                "memory_mb",
                "wall_seconds",
                "max_processes",
                "max_file_size_mb",
                "max_output_bytes",
            )
        } | {"fallback": self.effective_fallback, "host_network": self.effective_host_network}


class Secret(TenantOwnedModel):
    """A tenant secret: referenced as {{secret:NAME}}, injected at execution, redacted everywhere."""

    name = models.CharField(max_length=100, validators=[RegexValidator(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")])
    value_encrypted = models.TextField(editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="unique_secret_name")]

    def __str__(self) -> str:
        return self.name


class MCPOAuthGrant(TenantOwnedModel):
    """What an authorization server granted this tenant for one MCP server: tokens and the
    registered client, encrypted at rest (tenancy_app.crypto), never shown in admin or API.

    Written only by `tools_app.mcp.oauth`. `consent_version` changes when the authorization
    does (connected, revoked, consent lost): it is the `auth_key` of connections. A token
    refresh does not change it (same consent), it bumps `token_version` instead, which
    compare-and-set writes check so a stale writer cannot undo a newer one.
    """

    server = models.OneToOneField(MCPServer, on_delete=models.CASCADE, related_name="oauth_grant")
    tokens_encrypted = models.TextField(blank=True)
    client_info_encrypted = models.TextField(blank=True)
    # Not secret, kept in clear for the status column.
    expires_at = models.DateTimeField(null=True, blank=True)
    has_refresh_token = models.BooleanField(default=False)
    consent_version = models.PositiveIntegerField(default=0)
    token_version = models.PositiveIntegerField(default=0)
    connected_at = models.DateTimeField(null=True, blank=True)
    connected_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Why the tokens were dropped (revoked by an admin, refused by the authorization server).
    lost_reason = models.CharField(max_length=300, blank=True)
    # One process refreshes at a time (across workers): the holder's lease ends here.
    refresh_lease_until = models.DateTimeField(null=True, blank=True)
    # The authorization server's token revocation endpoint (RFC 7009), from its metadata when it
    # last issued tokens: an admin's Revoke tells it. Empty: it named none.
    revocation_endpoint = models.URLField(max_length=500, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "MCP OAuth grant"


class MCPOAuthAttempt(TenantOwnedModel):
    """One admin's "Connect", from the authorization URL to the callback, keyed by its `state`.

    The callback view (any web process) stores the code here; the flow's thread (in the
    process that started it) waits for it. Expired or finished attempts are useless.
    """

    class Status(models.TextChoices):
        WAITING = "waiting", "Waiting for the callback"
        CODE_RECEIVED = "code_received", "Code received"
        CONNECTED = "connected", "Connected"
        FAILED = "failed", "Failed"

    state = models.CharField(max_length=200, unique=True)
    server = models.ForeignKey(MCPServer, on_delete=models.CASCADE, related_name="+")
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=15, choices=Status.choices, default=Status.WAITING)
    code_encrypted = models.TextField(blank=True)
    iss = models.CharField(max_length=500, blank=True)
    outcome = models.CharField(max_length=500, blank=True, help_text="How it went, in a sentence.")
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "MCP OAuth attempt"
