"""stdio MCP servers are operator-only (issue #8, part 1; ARCHITECTURE §7 trust boundary).

A tenant owner (staff, not a superuser) tries every path to run a command on the host: the
admin add form, a forged POST with stdio fields, a change of an operator's server, enabling a
server the security migration disabled, and the "test connection and refresh tools" action.
Each command would `touch` a marker file; the marker must never exist. Operators (superusers,
`manage.py mcp_server add`) still add and run stdio servers.
"""

from __future__ import annotations

import importlib
import json

import pytest
from django.apps import apps
from django.core.management import call_command
from django.utils.html import escape

from tests.factories import example_stdio_fields
from tools_app.mcp.client import MCPError, connection_for
from tools_app.mcp.sync import (
    STDIO_NOT_APPROVED,
    STDIO_OPERATOR_ONLY,
    add_server,
    refresh_server,
    save_server,
)
from tools_app.models import MCPServer, Tool

pytestmark = pytest.mark.django_db

ADMIN = "/admin/tools_app/mcpserver"


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "pwned"


def touch_args(marker) -> list[str]:
    return ["-c", f"touch {marker}"]


def stdio_post(tenant, marker, **extra) -> dict:
    return {
        "tenant": tenant.pk,
        "name": "evil",
        "transport": "stdio",
        "command": "/bin/sh",
        "args": json.dumps(touch_args(marker)),
        "env": "{}",
        "url": "",
        "headers": "{}",
        "timeout_seconds": 5,
        "enabled": "on",
        **extra,
    }


def refresh_action(client, server):
    return client.post(
        f"{ADMIN}/", {"action": "test_and_refresh", "_selected_action": [server.pk]}, follow=True
    )


def test_a_tenant_owner_cannot_add_a_stdio_server_in_admin(owner_a_admin, tenant_a, marker):
    page = owner_a_admin.get(f"{ADMIN}/add/").content.decode()
    # The command, arguments and environment are not even inputs for a tenant admin.
    assert 'name="command"' not in page and 'name="args"' not in page and 'name="env"' not in page

    response = owner_a_admin.post(f"{ADMIN}/add/", stdio_post(tenant_a, marker))

    assert response.status_code == 200  # the form again, with the refusal
    assert escape(STDIO_OPERATOR_ONLY) in response.content.decode()
    assert not MCPServer.objects.exists()
    assert not marker.exists()


def test_a_forged_post_cannot_change_an_operators_stdio_command(owner_a_admin, tenant_a, marker):
    server = add_server(tenant_a, "example", MCPServer.Transport.STDIO, **example_stdio_fields())
    assert server.configured_by_operator

    response = owner_a_admin.post(
        f"{ADMIN}/{server.pk}/change/", stdio_post(tenant_a, marker, name="example"), follow=True
    )

    assert response.status_code == 200
    server.refresh_from_db()
    # The forged command fields were ignored (read-only); the operator's command stands.
    assert (server.command, server.args) == (
        example_stdio_fields()["command"],
        example_stdio_fields()["args"],
    )
    assert server.configured_by_operator
    refresh_server(server)
    assert not marker.exists()


def test_a_tenant_owner_cannot_turn_an_http_server_into_a_stdio_one(owner_a_admin, tenant_a, marker):
    server = MCPServer.objects.create(
        tenant=tenant_a, name="remote", transport="streamable_http", url="https://mcp.example.com/mcp"
    )
    response = owner_a_admin.post(f"{ADMIN}/{server.pk}/change/", stdio_post(tenant_a, marker, name="remote"))

    assert escape(STDIO_OPERATOR_ONLY) in response.content.decode()
    server.refresh_from_db()
    assert server.transport == "streamable_http" and server.command == ""
    assert not marker.exists()


def test_the_refresh_action_never_starts_a_command_no_operator_set(owner_a_admin, tenant_a, marker):
    # As a row from before the rule (or one written by any path but an operator's) would be.
    server = MCPServer.objects.create(
        tenant=tenant_a, name="evil", transport="stdio", command="/bin/sh", args=touch_args(marker)
    )

    page = refresh_action(owner_a_admin, server).content.decode()

    assert "was not started" in page and "only an operator" in page
    assert not marker.exists()
    server.refresh_from_db()
    assert server.status == MCPServer.Status.ERROR


def test_a_tenant_change_of_an_operator_command_voids_the_approval(tenant_a, marker):
    """Model layer: any save that is not an operator's and changes the command clears the flag."""
    server = add_server(tenant_a, "example", MCPServer.Transport.STDIO, **example_stdio_fields())
    server = MCPServer.objects.get(pk=server.pk)
    server.command, server.args = "/bin/sh", touch_args(marker)
    server.save()

    server.refresh_from_db()
    assert not server.configured_by_operator
    with pytest.raises(MCPError, match="only an operator"):
        connection_for(server, {})
    with pytest.raises(MCPError):
        refresh_server(server)
    assert not marker.exists()


def test_a_tenant_owner_may_disable_and_enable_an_operators_stdio_server(owner_a_admin, tenant_a):
    server = add_server(tenant_a, "example", MCPServer.Transport.STDIO, **example_stdio_fields())
    form = {"tenant": tenant_a.pk, "name": "example", "url": "", "headers": "{}", "timeout_seconds": 30}

    owner_a_admin.post(f"{ADMIN}/{server.pk}/change/", form)  # "enabled" unchecked
    server.refresh_from_db()
    assert not server.enabled and server.configured_by_operator

    owner_a_admin.post(f"{ADMIN}/{server.pk}/change/", {**form, "enabled": "on"})
    server.refresh_from_db()
    assert server.enabled and server.configured_by_operator

    page = refresh_action(owner_a_admin, server).content.decode()
    assert "xample: connected; 9 tool(s)" in page  # the operator's server runs for the tenant


def test_the_migration_disables_tenant_stdio_servers_with_a_reason(owner_a_admin, tenant_a, marker):
    server = MCPServer.objects.create(
        tenant=tenant_a, name="legacy", transport="stdio", command="/bin/sh", args=touch_args(marker)
    )
    http = MCPServer.objects.create(
        tenant=tenant_a, name="remote", transport="streamable_http", url="https://mcp.example.com/mcp"
    )
    migration = importlib.import_module("tools_app.migrations.0003_disable_unapproved_stdio_servers")
    migration.disable_unapproved_stdio(apps, None)

    server.refresh_from_db()
    http.refresh_from_db()
    assert not server.enabled and "only an operator may configure it" in server.disabled_reason
    assert http.enabled and http.disabled_reason == ""
    assert escape(server.disabled_reason[:80]) in owner_a_admin.get(f"{ADMIN}/").content.decode()
    change_page = owner_a_admin.get(f"{ADMIN}/{server.pk}/change/").content.decode()
    assert escape(server.disabled_reason) in change_page

    # The tenant owner cannot switch it back on; nothing ran.
    response = owner_a_admin.post(
        f"{ADMIN}/{server.pk}/change/",
        {
            "tenant": tenant_a.pk,
            "name": "legacy",
            "url": "",
            "headers": "{}",
            "timeout_seconds": 30,
            "enabled": "on",
        },
    )
    assert escape(STDIO_NOT_APPROVED) in response.content.decode()
    server.refresh_from_db()
    assert not server.enabled
    assert not marker.exists()


def example_form() -> dict:
    """The stdio fields an operator enters in admin to run the example server in the sandbox."""
    example = example_stdio_fields()
    return {
        "transport": "stdio",
        "command": example["command"],
        "args": json.dumps(example["args"]),
        "env": json.dumps(example["env"]),
        "sandbox_read_paths": json.dumps(example["sandbox_read_paths"]),
    }


def test_an_operator_adds_and_runs_a_stdio_server_in_admin(operator_admin, tenant_a):
    response = operator_admin.post(
        f"{ADMIN}/add/",
        {
            "tenant": tenant_a.pk,
            "name": "example",
            **example_form(),
            "url": "",
            "headers": "{}",
            "timeout_seconds": 30,
            "enabled": "on",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    server = MCPServer.objects.get(tenant=tenant_a, name="example")
    assert server.configured_by_operator

    page = refresh_action(operator_admin, server).content.decode()
    assert "xample: connected; 9 tool(s)" in page


def test_an_operators_save_re_enables_a_disabled_legacy_server(operator_admin, tenant_a):
    server = MCPServer.objects.create(
        tenant=tenant_a,
        name="legacy",
        transport="stdio",
        command="/usr/bin/python3",
        args=["-m", "tools_app.mcp.example_server"],
        enabled=False,
        disabled_reason="Disabled by a security update",
    )
    response = operator_admin.post(
        f"{ADMIN}/{server.pk}/change/",
        {
            "tenant": tenant_a.pk,
            "name": "legacy",
            **example_form(),
            "url": "",
            "headers": "{}",
            "timeout_seconds": 30,
            "enabled": "on",
        },
    )
    assert response.status_code == 302
    server.refresh_from_db()
    assert server.enabled and server.configured_by_operator and server.disabled_reason == ""


def test_manage_py_mcp_server_add_is_an_operator_path(tenant_a, capsys):
    call_command(
        "mcp_server",
        "add",
        "example",
        "--tenant",
        tenant_a.slug,
        "--python-module",
        "tools_app.mcp.example_server",
    )
    server = MCPServer.objects.get(tenant=tenant_a, name="example")
    assert server.configured_by_operator
    assert Tool.objects.filter(mcp_server=server, name="example__add").exists()


def test_the_owner_operation_refuses_a_tenant_stdio_server(tenant_a, marker):
    with pytest.raises(ValueError, match="Only an operator"):
        add_server(
            tenant_a,
            "evil",
            MCPServer.Transport.STDIO,
            command="/bin/sh",
            args=touch_args(marker),
            by_operator=False,
        )
    assert not MCPServer.objects.exists()
    assert not marker.exists()


# --- the sandbox of a stdio server is the operator's too (issue #14) ---------------------------


def test_a_tenant_owner_cannot_open_the_network_or_read_paths_in_admin(owner_a_admin, tenant_a):
    server = add_server(tenant_a, "example", MCPServer.Transport.STDIO, **example_stdio_fields())
    read_paths = list(server.sandbox_read_paths)

    page = owner_a_admin.get(f"{ADMIN}/{server.pk}/change/").content.decode()
    assert 'name="network_enabled"' not in page and 'name="sandbox_read_paths"' not in page

    owner_a_admin.post(
        f"{ADMIN}/{server.pk}/change/",
        {
            "tenant": tenant_a.pk,
            "name": "example",
            "url": "",
            "headers": "{}",
            "timeout_seconds": 30,
            "enabled": "on",
            "network_enabled": "on",
            "sandbox_read_paths": json.dumps(["/", "/etc"]),
        },
    )

    server.refresh_from_db()
    assert not server.network_enabled and server.sandbox_read_paths == read_paths
    assert server.configured_by_operator and server.enabled


def test_a_tenant_change_of_the_network_or_read_paths_voids_the_approval(tenant_a):
    for change in ({"network_enabled": True}, {"sandbox_read_paths": ["/usr/share"]}):
        server = add_server(tenant_a, "example", MCPServer.Transport.STDIO, **example_stdio_fields())
        server = MCPServer.objects.get(pk=server.pk)
        for name, value in change.items():
            setattr(server, name, value)

        with pytest.raises(ValueError, match="network or read-only paths"):
            save_server(server, by_operator=False)  # the owner operation refuses...
        server.save()  # ...and any other save drops the operator's approval
        server.refresh_from_db()
        assert not server.configured_by_operator
        with pytest.raises(MCPError, match="only an operator"):
            connection_for(server, {})
        server.delete()


def test_sandbox_options_belong_to_stdio_servers_only(tenant_a):
    for options in ({"network_enabled": True}, {"sandbox_read_paths": ["/usr/share"]}):
        with pytest.raises(ValueError, match="belong to a stdio MCP server"):
            add_server(
                tenant_a,
                "remote",
                "streamable_http",
                url="https://mcp.example.com/mcp",
                by_operator=False,
                **options,
            )
    assert not MCPServer.objects.exists()


def test_an_operator_cannot_show_a_server_product_data_in_admin(operator_admin, tenant_a, settings):
    response = operator_admin.post(
        f"{ADMIN}/add/",
        {
            "tenant": tenant_a.pk,
            "name": "nosy",
            **example_form(),
            "sandbox_read_paths": json.dumps([str(settings.BASE_DIR)]),
            "url": "",
            "headers": "{}",
            "timeout_seconds": 30,
            "enabled": "on",
        },
    )

    assert response.status_code == 200
    assert "would show the server product data" in response.content.decode()
    assert not MCPServer.objects.filter(name="nosy").exists()
