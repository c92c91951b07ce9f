"""Which tools exist for a tenant and which a Session may call.

Native tools are mirrored into global `Tool` rows (so admins can disable or re-risk them);
MCP tools are rows written by `mcp.sync.refresh_server`. A Session may call the native
defaults plus whatever its capabilities (tools, tool sets) name. Rows of the tenant win over
global rows of the same name.
"""

from __future__ import annotations

import copy

from django.conf import settings
from django.db.models import Prefetch, Q

from approvals_app.choices import ToolSource

from .base import Tool as ToolImpl
from .models import Readiness, Tool, ToolSet
from .registry import KIND_BOUND_TOOLS, NATIVE_TOOLS, default_tool_names


def sync_native_tools() -> int:
    """Mirror the code registry into global Tool rows; admin choices (enabled, risk) are kept."""
    count = 0
    for name, impl in NATIVE_TOOLS.items():
        _, created = Tool.objects.update_or_create(
            tenant=None,
            name=name,
            defaults={
                "description": impl.description,
                "input_schema": impl.input_schema,
                "source": ToolSource.NATIVE,
            },
            create_defaults={
                "description": impl.description,
                "input_schema": impl.input_schema,
                "source": ToolSource.NATIVE,
                "risk": str(impl.risk),
                "read_only": impl.read_only,
                "idempotent": impl.idempotent,
            },
        )
        count += created
    return count


def _implementation(row: Tool) -> ToolImpl | None:
    if row.source == ToolSource.NATIVE:
        impl = NATIVE_TOOLS.get(row.name)
        if impl is None:
            return None
        impl = copy.copy(impl)
        impl.risk, impl.read_only, impl.idempotent = row.risk, row.read_only, row.idempotent
    else:
        from .mcp.tool import MCPTool

        impl = MCPTool.from_row(row)
    impl.enabled = row.enabled
    impl.toolsets = tuple(sorted(t.name for t in row.toolsets.all()))  # for approval rules by tool set
    impl.unavailable_reason = (
        (row.readiness_reason or "not ready") if row.readiness != Readiness.READY else ""
    )
    return impl


def resolve_available(tenant_id: int, tool_names, toolset_names) -> dict[str, ToolImpl]:
    """The tools a Session may call, by the name the model sees (one query)."""
    wanted = set(tool_names) | set(default_tool_names())
    rows = (
        Tool.objects.for_tenant(tenant_id)
        .filter(
            Q(name__in=wanted)
            | Q(toolsets__name__in=list(toolset_names), toolsets__tenant_id__in=[tenant_id, None])
        )
        .select_related("mcp_server")
        .prefetch_related(_tenant_toolsets(tenant_id))
        .distinct()
    )
    available: dict[str, ToolImpl] = {name: NATIVE_TOOLS[name] for name in default_tool_names()}
    for row in sorted(rows, key=lambda r: r.tenant_id is not None):  # tenant rows last: they win
        impl = _implementation(row)
        if impl is not None:
            available[row.name] = impl
    return available


def _tenant_toolsets(tenant_id: int) -> Prefetch:
    # A global tool may sit in tool sets of several tenants; a tenant's approval rules see only its own.
    return Prefetch("toolsets", queryset=ToolSet.objects.for_tenant(tenant_id))


def resolve_one(tenant_id: int, name: str) -> ToolImpl | None:
    """The tool a Session of this tenant would get for `name` (as in `resolve_available`), or None."""
    rows = (
        Tool.objects.for_tenant(tenant_id)
        .filter(name=name)
        .select_related("mcp_server")
        .prefetch_related(_tenant_toolsets(tenant_id))
    )
    for row in sorted(rows, key=lambda r: r.tenant_id is None):  # the tenant's row wins
        return _implementation(row)
    return NATIVE_TOOLS.get(name)


def policy_facts(tool: ToolImpl):
    """What approval rules may match on besides the arguments. The runtime's approval stage and the
    admin's "Test a call" both use this, so the two cannot disagree."""
    from approvals_app.policy import CallFacts

    server = getattr(tool, "server_name", "") or ""
    return CallFacts(
        name=tool.name,
        source=ToolSource.MCP if server else ToolSource.NATIVE,
        risk=str(tool.risk),
        toolsets=tuple(getattr(tool, "toolsets", ()) or ()),
        server=server,
        remote_name=getattr(tool, "remote_name", "") or "",
    )


def policy_facts_for(tenant_id: int, name: str):
    """`policy_facts` of the tenant's tool called `name`; None if it has none (registered with approvals)."""
    tool = resolve_one(tenant_id, name)
    return policy_facts(tool) if tool is not None else None


def sandbox_limits_for(tenant_id: int):
    """The tenant's default SandboxPolicy (a tenant row wins over a global one), else the built-in
    limits; either way within the operator's ceilings."""
    from .models import SandboxPolicy
    from .sandbox.policy import DEFAULT_LIMITS, SandboxLimits, within_ceilings

    policies = SandboxPolicy.objects.for_tenant(tenant_id).filter(is_default=True)
    policy = sorted(policies, key=lambda p: p.tenant_id is None)[:1]
    limits = SandboxLimits(**policy[0].limits_kwargs()) if policy else DEFAULT_LIMITS
    return within_ceilings(limits, settings.XAGENT_SANDBOX_CEILINGS)


def rule_vocabulary(tenant_ids: list[int]) -> tuple[list[str], list[str]]:
    """(tool names, tool set names) of these tenants and the global ones: what the approval rule
    editor suggests. Without a tenant, the global ones only."""
    tools: set[str] = set()
    toolsets: set[str] = set()
    for tenant_id in tenant_ids or [None]:
        tools |= tenant_tool_names(tenant_id)
        toolsets.update(ToolSet.objects.for_tenant(tenant_id).values_list("name", flat=True))
    return sorted(tools), sorted(toolsets)


def tenant_tool_names(tenant_id: int) -> set[str]:
    """Every tool name this tenant has (loaded in a Session or not): tells "not loaded" from "unknown"."""
    return set(Tool.objects.for_tenant(tenant_id).values_list("name", flat=True)) | set(NATIVE_TOOLS)


def find(tenant_id: int, query: str, exclude: set[str], limit: int = 20) -> list[dict]:
    """Tools and tool sets the tenant allows, matching any query term, not already loaded."""
    terms = [t for t in query.lower().replace(",", " ").split() if len(t) > 1][:8]
    if not terms:
        return []
    match = Q()
    for term in terms:
        match |= Q(name__icontains=term) | Q(description__icontains=term)
    found = []
    for toolset in ToolSet.objects.for_tenant(tenant_id).filter(match).prefetch_related("tools")[:limit]:
        if toolset.name not in exclude:
            found.append(
                {
                    "kind": "toolset",
                    "name": toolset.name,
                    "description": toolset.description[:300],
                    "tools": sorted(t.name for t in toolset.tools.all() if t.enabled),
                }
            )
    rows = Tool.objects.for_tenant(tenant_id).filter(match, enabled=True, readiness=Readiness.READY)
    for row in rows.exclude(name__in=KIND_BOUND_TOOLS).select_related("mcp_server")[:limit]:
        if row.name not in exclude:
            entry = {"kind": "tool", "name": row.name, "description": row.description[:300], "risk": row.risk}
            if row.mcp_server_id:
                entry["server"] = row.mcp_server.name
            found.append(entry)
    return found[:limit]


def selectable(tenant_id: int, *, exclude_tools=(), exclude_toolsets=()) -> list[dict]:
    """What a Session of this tenant could still add (orchestration's candidates): the tenant's
    tool sets and its enabled, ready tools, by the same fields `find` shows, less the excluded
    names (what the Session has already). A tenant's row hides a global one of the same name.
    Two queries, ordered by name."""
    excluded_sets, excluded_tools = set(exclude_toolsets), set(exclude_tools)
    toolsets = {}
    for toolset in sorted(
        ToolSet.objects.for_tenant(tenant_id).prefetch_related("tools"), key=lambda t: t.tenant_id is not None
    ):
        toolsets[toolset.name] = {
            "kind": "toolset",
            "name": toolset.name,
            "description": toolset.description[:300],
            "tools": sorted(t.name for t in toolset.tools.all() if t.enabled),
        }
    tools = {}
    rows = Tool.objects.for_tenant(tenant_id).filter(enabled=True, readiness=Readiness.READY)
    rows = rows.exclude(name__in=KIND_BOUND_TOOLS)
    for row in sorted(rows.select_related("mcp_server"), key=lambda r: r.tenant_id is not None):
        entry = {"kind": "tool", "name": row.name, "description": row.description[:300], "risk": row.risk}
        if row.mcp_server_id:
            entry["server"] = row.mcp_server.name
        tools[row.name] = entry
    return [
        *(toolsets[name] for name in sorted(toolsets) if name not in excluded_sets),
        *(tools[name] for name in sorted(tools) if name not in excluded_tools),
    ]


def mcp_servers_of(tenant_id: int, *, tools=(), toolsets=()) -> dict[tuple[str, str], list[str]]:
    """The MCP servers behind the named tools and tool sets, as `{(kind, name): [server...]}`
    (native ones have none): where a Session's capabilities come from. Two queries."""
    found: dict[tuple[str, str], set[str]] = {}
    if tools:
        rows = Tool.objects.for_tenant(tenant_id).filter(name__in=list(tools), mcp_server__isnull=False)
        for name, server in rows.values_list("name", "mcp_server__name"):
            found.setdefault(("tool", name), set()).add(server)
    if toolsets:
        rows = ToolSet.objects.for_tenant(tenant_id).filter(
            name__in=list(toolsets), tools__mcp_server__isnull=False
        )
        for name, server in rows.values_list("name", "tools__mcp_server__name"):
            found.setdefault(("toolset", name), set()).add(server)
    return {key: sorted(servers) for key, servers in found.items()}


def known_names(tenant_id: int, names) -> tuple[list[str], list[str], list[str]]:
    """Split requested names into (tools, toolsets, unknown) for this tenant."""
    names = list(dict.fromkeys(names))
    tools = set(
        Tool.objects.for_tenant(tenant_id)
        .filter(name__in=names, enabled=True)
        .exclude(name__in=KIND_BOUND_TOOLS)
        .values_list("name", flat=True)
    )
    toolsets = set(
        ToolSet.objects.for_tenant(tenant_id).filter(name__in=names).values_list("name", flat=True)
    )
    unknown = [n for n in names if n not in tools and n not in toolsets]
    return [n for n in names if n in tools], [n for n in names if n in toolsets and n not in tools], unknown
