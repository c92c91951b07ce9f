"""Owner operations for MCP servers: adding or changing one, and refreshing the Tool rows it provides.

This module owns `MCPServer.status` / `last_error` / `last_refreshed_at`, who may set what on a
server (`check_server_change`: stdio commands are operator-only, tenant URLs pass the outbound
guard) and the MCP-sourced `Tool` rows. The admin (form and action), the `mcp_server` command
and `MCPTool` all go through it.

Risk and flags of a tool are derived from the server's annotations only when its row is
created: on a later refresh an admin's tightening (say, `read` -> `destructive`) is kept, and
only what the server describes (description, schema, declared hints) and readiness follow it.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.db import close_old_connections, transaction
from django.db import connection as db_connection
from django.utils import timezone

from approvals_app.choices import Risk, ToolSource
from tenancy_app.versioning import bump as bump_config_version
from tools_app.models import MCPServer, Readiness, Tool
from tools_app.net import OutboundRefused, check_url
from tools_app.secrets import tenant_secret_values

from .stdio import check_read_paths

if TYPE_CHECKING:
    from .client import Connection, RemoteTool

# The MCP SDK is imported where a connection is made, not here: this module is loaded at every
# process start (the admin and the app registry import it) and the SDK alone costs about a second.

logger = logging.getLogger(__name__)

TOOL_NAME_MAX = 64
REMOTE_NAME_MAX = 200
REASON_MAX = 500
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]+")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


@dataclass
class RefreshResult:
    """The tools the server now provides, and the model-facing names that changed."""

    tools: list[Tool]
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def tool_name_for(server_name: str, remote_name: str) -> str:
    """The model-facing name `<server>__<remote>`, fit for `^[a-zA-Z0-9_-]{1,64}$`.

    Characters outside the pattern become `_`; a name that is too long keeps its start and
    gets a short hash of the remote name, so two long names stay distinct.
    """
    name = _UNSAFE.sub("_", f"{server_name}__{remote_name}")
    if len(name) <= TOOL_NAME_MAX:
        return name
    digest = hashlib.sha1(remote_name.encode()).hexdigest()[:8]
    return f"{name[: TOOL_NAME_MAX - 9]}_{digest}"


def defaults_from_hints(hints: dict) -> dict:
    """Risk and flags for a new row, from the server's (untrusted) annotations."""
    if hints.get("readOnlyHint"):
        risk, read_only = Risk.READ, True
    elif hints.get("destructiveHint"):
        risk, read_only = Risk.DESTRUCTIVE, False
    elif hints.get("openWorldHint"):
        risk, read_only = Risk.EXTERNAL, False
    else:
        risk, read_only = Risk.WRITE, False
    return {"risk": risk, "read_only": read_only, "idempotent": bool(hints.get("idempotentHint"))}


# --- refresh --------------------------------------------------------------------------------


def refresh_server(server: MCPServer, *, pooled: bool = False) -> RefreshResult:
    """Connect with the tenant's secrets, list the tools, and bring the Tool rows in line.

    `pooled=True` lists on this process's pooled session of the server (a list_changed refresh)
    instead of a connection of its own (an admin's refresh, which proves a new one works).
    On failure the server is marked `error`, its tools `unavailable`, and the MCPError re-raised.
    """
    from .client import MCPError, connection_for, list_tools

    try:
        conn = connection_for(server, tenant_secret_values(server.tenant_id))
        remote = list_tools(conn, timeout=server.timeout_seconds, pooled=pooled)
    except MCPError as exc:
        record_server_error(server, str(exc))
        raise
    return _apply_listing(server, remote)


def refresh_after_tools_changed(conn: Connection) -> None:
    """A pooled session heard `notifications/tools/list_changed`: refresh that server's Tool rows.

    Runs in a thread of the pool (pool.py), so it owns its database connection and closes it.
    A server that is gone, disabled or reconfigured since (another key) is left alone.
    """
    from .client import MCPError

    if conn.server_id is None or conn.tenant_id is None:
        return
    close_old_connections()
    try:
        server = MCPServer.objects.for_tenant(conn.tenant_id).filter(pk=conn.server_id, enabled=True).first()
        if server is None:
            return
        result = refresh_server(server, pooled=True)
        logger.info(
            "MCP server %s changed its tools: added %s, updated %s, removed %s",
            server.name,
            result.added,
            result.updated,
            result.removed,
        )
    except MCPError as exc:
        logger.warning("MCP server %s changed its tools, but listing them failed: %s", conn.server_name, exc)
    finally:
        db_connection.close()


def _apply_listing(server: MCPServer, remote: list[RemoteTool]) -> RefreshResult:
    result = RefreshResult(tools=[])
    now = timezone.now()
    with transaction.atomic():
        # Serialises two refreshes of one server (a no-op lock on SQLite, whose writes are serial anyway).
        locked = MCPServer.objects.select_for_update().get(pk=server.pk)
        existing = {row.remote_name: row for row in Tool.objects.filter(mcp_server=locked)}
        taken = set(
            Tool.objects.for_tenant(locked.tenant_id)
            .exclude(mcp_server=locked)
            .values_list("name", flat=True)
        ) | {row.name for row in existing.values()}
        listed: set[str] = set()
        for item in remote:
            if item.name in listed:
                continue  # a server listing one name twice: the first one wins
            if not item.name or len(item.name) > REMOTE_NAME_MAX:
                logger.warning(
                    "MCP server %s lists a tool with an unusable name %r", locked.name, item.name[:80]
                )
                continue
            listed.add(item.name)
            row = existing.get(item.name)
            if row is None:
                row = _create_row(locked, item, taken)
                result.added.append(row.name)
            elif _update_row(row, item):
                result.updated.append(row.name)
            taken.add(row.name)
            result.tools.append(row)
        gone = f"No longer listed by MCP server {locked.name!r}"
        for remote_name, row in existing.items():
            if remote_name in listed or row.readiness_reason.startswith(gone):
                continue
            row.readiness = Readiness.UNAVAILABLE
            row.readiness_reason = _reason(f"{gone} (refreshed {now:%Y-%m-%d %H:%M} UTC).")
            row.save(update_fields=["readiness", "readiness_reason", "updated_at"])
            result.removed.append(row.name)
        locked.status = MCPServer.Status.OK
        locked.last_error = ""
        locked.last_refreshed_at = now
        locked.save(update_fields=["status", "last_error", "last_refreshed_at"])
    server.status, server.last_error, server.last_refreshed_at = locked.status, "", now
    return result


def _create_row(server: MCPServer, item: RemoteTool, taken: set[str]) -> Tool:
    name = tool_name_for(server.name, item.name)
    if name in taken:
        digest = hashlib.sha1(item.name.encode()).hexdigest()[:8]
        name = f"{name[: TOOL_NAME_MAX - 9]}_{digest}"
    return Tool.objects.create(
        tenant_id=server.tenant_id,
        name=name,
        description=item.description,
        input_schema=item.input_schema,
        source=ToolSource.MCP,
        mcp_server=server,
        remote_name=item.name,
        declared_hints=item.annotations,
        readiness=Readiness.READY,
        readiness_reason="",
        **defaults_from_hints(item.annotations),
    )


def _update_row(row: Tool, item: RemoteTool) -> bool:
    """Follow the server's description; risk and flags stay as the row has them. True if changed."""
    changes = {
        "description": item.description,
        "input_schema": item.input_schema,
        "declared_hints": item.annotations,
        "readiness": Readiness.READY,
        "readiness_reason": "",
    }
    changed = [name for name, value in changes.items() if getattr(row, name) != value]
    if not changed:
        return False
    for name in changed:
        setattr(row, name, changes[name])
    row.save(update_fields=[*changed, "updated_at"])
    # A tool coming back after an outage is not "updated"; only a changed description is.
    return bool(set(changed) - {"readiness", "readiness_reason"})


def record_server_error(server: MCPServer, message: str, *, tools_unavailable: bool = True) -> None:
    """The server failed: status `error` with the message, and (by default) its tools unavailable."""
    reason = _reason(f"MCP server {server.name!r} is failing: {message}")
    with transaction.atomic():
        MCPServer.objects.filter(pk=server.pk).update(status=MCPServer.Status.ERROR, last_error=message)
        if tools_unavailable:
            Tool.objects.filter(mcp_server_id=server.pk).exclude(
                readiness=Readiness.UNAVAILABLE, readiness_reason=reason
            ).update(readiness=Readiness.UNAVAILABLE, readiness_reason=reason, updated_at=timezone.now())
            bump_config_version(server.tenant_id)  # a bulk update sends no signal
    server.status, server.last_error = MCPServer.Status.ERROR, message


def record_server_ok(server: MCPServer) -> None:
    """A call went through after an error: the server is reachable again.

    Tools stay as the last refresh left them; only a refresh brings unavailable tools back.
    """
    if server.status == MCPServer.Status.OK:
        return
    MCPServer.objects.filter(pk=server.pk).update(status=MCPServer.Status.OK, last_error="")
    server.status, server.last_error = MCPServer.Status.OK, ""


def _reason(text: str) -> str:
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 1] + "…"


# --- who may set what -----------------------------------------------------------------------

STDIO_OPERATOR_ONLY = (
    "Only an operator (a superuser, or manage.py mcp_server add) can add a stdio MCP server or "
    "change its command, arguments, environment, network or read-only paths: it runs a command on "
    "the host. Tenant admins can enable or disable a stdio server an operator set up, or add a "
    "Streamable HTTP server."
)
SANDBOX_FIELDS_STDIO_ONLY = "Network access and read-only paths belong to a stdio MCP server's sandbox."
STDIO_NOT_APPROVED = (
    "This stdio MCP server stays disabled until an operator (a superuser) reviews its command "
    "and saves it: it runs a command on the host."
)


class OperatorOnly(ValueError):
    """A tenant admin tried something only an operator may do; the message says what and why."""


def check_server_change(server: MCPServer, *, by_operator: bool) -> None:
    """Refuse what the acting person may not set on `server` (new, or loaded and then edited).

    Operators may set anything but read-only paths that would show a server product data
    (`stdio.check_read_paths`). Anyone else may not create a stdio server, change the transport,
    command, arguments, environment, network or read-only paths of one, or enable one no
    operator approved; a new or changed URL must pass the outbound guard.
    """
    if server.transport == MCPServer.Transport.STDIO:
        if server.pk is None or server.operator_fields_changed():
            # Operators too: a path that would show the server product data is refused.
            server.sandbox_read_paths = check_read_paths(server.sandbox_read_paths)
    elif server.network_enabled or server.sandbox_read_paths:
        raise ValueError(SANDBOX_FIELDS_STDIO_ONLY)
    if by_operator:
        return
    if server.transport == MCPServer.Transport.STDIO:
        if server.pk is None or server.operator_fields_changed():
            raise OperatorOnly(STDIO_OPERATOR_ONLY)
        if server.enabled and not server.configured_by_operator:
            raise OperatorOnly(STDIO_NOT_APPROVED)
    elif server.pk is None or server.operator_fields_changed():
        try:
            check_url(server.url)
        except OutboundRefused as exc:
            raise ValueError(str(exc)) from None


def save_server(server: MCPServer, *, by_operator: bool) -> MCPServer:
    """Save an admin's change of `server`, after `check_server_change`.

    An operator's save vouches for the server (and lifts a product-set `disabled_reason`);
    anyone else's change of its command or URL makes it a tenant-set server again.
    """
    from .oauth import forget_grant_if_moved

    check_server_change(server, by_operator=by_operator)
    if by_operator:
        server.disabled_reason = ""
    with transaction.atomic():
        forget_grant_if_moved(server)
        server.save(by_operator=by_operator)
    return server


# --- add ------------------------------------------------------------------------------------


def add_server(
    tenant,
    name: str,
    transport: str,
    *,
    command: str = "",
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    url: str = "",
    headers: dict[str, str] | None = None,
    timeout_seconds: int = 30,
    network_enabled: bool = False,
    sandbox_read_paths: list[str] | None = None,
    by_operator: bool = True,
) -> MCPServer:
    """Validate and create an MCP server of `tenant`. Raises ValueError with a clear message.

    This is the operator's path (`manage.py mcp_server add`), hence `by_operator=True` by
    default; a tenant-facing caller passes `by_operator=False` and gets the tenant rules.
    Values of `env` and `headers` may reference tenant secrets as `{{secret:NAME}}`; they are
    resolved only when the server is contacted.
    `network_enabled` and `sandbox_read_paths` shape a stdio server's sandbox (`mcp.stdio`).
    """
    args, env, headers = list(args or []), dict(env or {}), dict(headers or {})
    if transport not in MCPServer.Transport.values:
        raise ValueError(
            f"Unknown transport {transport!r}: use one of {', '.join(MCPServer.Transport.values)}."
        )
    if transport == MCPServer.Transport.STDIO:
        if not command.strip():
            raise ValueError("A stdio MCP server needs a command to run.")
        if url or headers:
            raise ValueError(
                "A stdio MCP server takes a command, arguments and environment, not a URL or headers."
            )
        if not all(isinstance(a, str) for a in args):
            raise ValueError("Arguments of a stdio MCP server must be strings.")
        for key, value in env.items():
            if not _ENV_NAME.match(str(key)) or not isinstance(value, str):
                raise ValueError(
                    f"Invalid environment variable {key!r}: use NAME=value with a letter or '_' first."
                )
    else:
        if not url.strip():
            raise ValueError("A Streamable HTTP MCP server needs a URL.")
        if urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"The URL {url!r} must start with http:// or https://.")
        if command or args or env:
            raise ValueError(
                "A Streamable HTTP MCP server takes a URL and headers, not a command or environment."
            )
        for key, value in headers.items():
            if (
                not _HEADER_NAME.match(str(key))
                or not isinstance(value, str)
                or "\n" in value
                or "\r" in value
            ):
                raise ValueError(f"Invalid HTTP header {key!r}: use Name=value on one line.")
    if timeout_seconds <= 0:
        raise ValueError("The timeout must be a positive number of seconds.")

    server = MCPServer(
        tenant=tenant,
        name=name,
        transport=transport,
        command=command,
        args=args,
        env=env,
        url=url,
        headers=headers,
        timeout_seconds=timeout_seconds,
        network_enabled=network_enabled,
        sandbox_read_paths=list(sandbox_read_paths or []),
    )
    try:
        server.full_clean(validate_constraints=False)
    except ValidationError as exc:
        raise ValueError(_first_message(exc)) from None
    check_server_change(server, by_operator=by_operator)
    with transaction.atomic():
        if MCPServer.objects.for_tenant(tenant).filter(name=name).exists():
            raise ValueError(f"An MCP server named {name!r} already exists in tenant {tenant.slug}.")
        server.save(by_operator=by_operator)
    return server


def _first_message(exc: ValidationError) -> str:
    if hasattr(exc, "error_dict"):
        field_name, errors = next(iter(exc.error_dict.items()))
        return f"{field_name}: {errors[0].messages[0]}"
    return exc.messages[0]
