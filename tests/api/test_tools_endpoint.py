"""GET /api/v1/tools/: the tools a tenant may use, tenant-scoped like the catalog a Session resolves."""

import pytest

from approvals_app.choices import Risk, ToolSource
from tools_app.models import MCPServer, Readiness, Tool
from tools_app.registry import NATIVE_TOOLS

from ..tenancy.isolation import TenantIsolationContract, assert_error_shape, result_ids

TOOLS = "/api/v1/tools/"
FIELDS = {"name", "source", "server", "risk", "read_only", "enabled", "readiness"}  # CONTRACT


def mcp_tool(tenant, server_name, remote_name, **fields):
    server, _ = MCPServer.objects.get_or_create(
        tenant=tenant,
        name=server_name,
        defaults={"transport": MCPServer.Transport.STREAMABLE_HTTP, "url": "https://mcp.test/"},
    )
    defaults = {"risk": Risk.READ, "read_only": True}
    return Tool.objects.create(
        tenant=tenant,
        name=f"{server_name}__{remote_name}",
        source=ToolSource.MCP,
        mcp_server=server,
        remote_name=remote_name,
        **{**defaults, **fields},
    )


def listed(client, url=TOOLS) -> dict[str, dict]:
    rows, next_url = [], url
    while next_url:
        body = client.get(next_url).json()
        rows.extend(body["results"])
        next_url = body["next"]
    return {row["name"]: row for row in rows}


@pytest.fixture
def acme_crm_search(tenant_a):
    return mcp_tool(tenant_a, "acme-crm", "search", description="Search Acme's customers")


class TestToolIsolation(TenantIsolationContract):
    list_url = TOOLS
    detail_methods = ("get",)  # read-only: admins manage tools in admin

    @pytest.fixture
    def tenant_a_object(self, acme_crm_search):
        return acme_crm_search


def test_it_lists_the_native_tools_and_the_tenants_mcp_tools(api_owner_a, acme_crm_search):
    tools = listed(api_owner_a)

    assert set(NATIVE_TOOLS) <= set(tools)
    assert FIELDS <= set(tools["fs_read"])
    assert {k: tools["fs_read"][k] for k in FIELDS} == {
        "name": "fs_read",
        "source": "native",
        "server": None,
        "risk": "read",
        "read_only": True,
        "enabled": True,
        "readiness": "ready",
    }
    crm = tools["acme-crm__search"]
    assert (crm["source"], crm["server"], crm["risk"], crm["read_only"]) == ("mcp", "acme-crm", "read", True)
    assert crm["id"] == acme_crm_search.pk and crm["description"] == "Search Acme's customers"


def test_tenant_b_never_sees_tenant_a_mcp_tools(api_outsider_b, acme_crm_search, tenant_a):
    mcp_tool(tenant_a, "acme-crm", "delete_customer", risk=Risk.DESTRUCTIVE, read_only=False)

    tools = listed(api_outsider_b)

    assert not [name for name in tools if name.startswith("acme-crm")]
    assert "acme-crm" not in str(api_outsider_b.get(TOOLS).content)
    assert set(NATIVE_TOOLS) <= set(tools), "the global native tools are everyone's"
    assert_error_shape(api_outsider_b.get(f"{TOOLS}{acme_crm_search.pk}/"), 404, "not_found")


def test_a_tenant_row_hides_the_global_row_of_the_same_name(api_owner_a, api_outsider_b, tenant_a):
    # As in the catalog a Session resolves: the tenant's row wins over the global one.
    Tool.objects.create(tenant=tenant_a, name="shell_exec", source=ToolSource.NATIVE, risk=Risk.DESTRUCTIVE)

    acme = result_ids(api_owner_a, f"{TOOLS}?page_size=200")
    shell = listed(api_owner_a)["shell_exec"]

    assert shell["risk"] == "destructive" and shell["id"] in acme
    assert Tool.objects.get(tenant=None, name="shell_exec").pk not in acme
    assert listed(api_outsider_b)["shell_exec"]["risk"] == str(NATIVE_TOOLS["shell_exec"].risk)


def test_enabled_and_readiness_say_whether_a_session_could_call_it(api_owner_a, tenant_a):
    mcp_tool(tenant_a, "acme-crm", "search")
    mcp_tool(tenant_a, "acme-docs", "read", readiness=Readiness.UNAVAILABLE, readiness_reason="timed out")
    MCPServer.objects.filter(name="acme-crm").update(enabled=False)
    Tool.objects.filter(tenant=None, name="fs_edit").update(enabled=False)

    tools = listed(api_owner_a)

    assert tools["acme-crm__search"]["enabled"] is False, "a disabled server disables its tools"
    assert tools["fs_edit"]["enabled"] is False
    docs = tools["acme-docs__read"]
    assert docs["enabled"] is True
    assert (docs["readiness"], docs["readiness_reason"]) == ("unavailable", "timed out")


def test_a_native_row_without_code_is_not_listed(api_owner_a):
    Tool.objects.create(tenant=None, name="phantom", source=ToolSource.NATIVE)

    assert "phantom" not in listed(api_owner_a)


def test_it_pages_by_name(api_owner_a, acme_crm_search):
    first = api_owner_a.get(f"{TOOLS}?page_size=3").json()
    names = list(listed(api_owner_a, f"{TOOLS}?page_size=3"))

    assert set(first) == {"results", "next", "previous"} and len(first["results"]) == 3
    assert names == sorted(names) and len(names) == len(set(names))
    assert "acme-crm__search" in names


def test_it_is_read_only(api_owner_a, acme_crm_search):
    assert_error_shape(api_owner_a.post(TOOLS, {"name": "x"}, format="json"), 405, "method_not_allowed")
    url = f"{TOOLS}{acme_crm_search.pk}/"
    assert_error_shape(api_owner_a.delete(url), 405, "method_not_allowed")
    assert Tool.objects.filter(pk=acme_crm_search.pk).exists()
