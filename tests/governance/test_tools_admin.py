"""Tools admin: tenant admins see their rows and the global ones, change only their own,
never see another tenant's servers or secrets; secret values are write-only."""

import pytest
from django.test import Client

from tools_app.models import MCPServer, Secret, Tool, ToolSet
from tools_app.secrets import set_secret

ADMIN = "/admin/tools_app"


@pytest.fixture
def owner_a_admin(owner_a):
    client = Client()
    client.force_login(owner_a)
    return client


@pytest.fixture
def rows(tenant_a, tenant_b, outsider_b):
    set_secret(tenant_a, "ACME_KEY", "acme-plain-value")
    set_secret(tenant_b, "BRAVO_KEY", "bravo-plain-value")
    MCPServer.objects.create(tenant=tenant_a, name="acme-files", transport="stdio", command="true")
    MCPServer.objects.create(tenant=tenant_b, name="bravo-crm", transport="stdio", command="true")
    ToolSet.objects.create(tenant=tenant_b, name="bravo-set")


@pytest.mark.django_db
def test_a_tenant_admin_sees_own_and_global_rows_only(owner_a_admin, rows):
    servers = owner_a_admin.get(f"{ADMIN}/mcpserver/").content.decode()
    assert "acme-files" in servers and "bravo-crm" not in servers
    secrets = owner_a_admin.get(f"{ADMIN}/secret/").content.decode()
    assert "ACME_KEY" in secrets and "BRAVO_KEY" not in secrets
    tools = owner_a_admin.get(f"{ADMIN}/tool/").content.decode()
    assert "fs_read" in tools  # global native tools are visible
    assert "bravo-set" not in owner_a_admin.get(f"{ADMIN}/toolset/").content.decode()
    bravo = MCPServer.objects.get(name="bravo-crm")
    assert owner_a_admin.get(f"{ADMIN}/mcpserver/{bravo.pk}/change/").status_code in (302, 404)


@pytest.mark.django_db
def test_global_rows_are_read_only_for_tenant_admins(owner_a_admin, rows):
    native = Tool.objects.get(tenant=None, name="fs_read")
    response = owner_a_admin.post(f"{ADMIN}/tool/{native.pk}/change/", {"name": "fs_read", "enabled": ""})
    assert response.status_code == 403
    native.refresh_from_db()
    assert native.enabled


@pytest.mark.django_db
def test_secret_values_are_write_only(owner_a_admin, rows, tenant_a):
    secret = Secret.objects.get(tenant=tenant_a, name="ACME_KEY")
    page = owner_a_admin.get(f"{ADMIN}/secret/{secret.pk}/change/").content.decode()
    assert "acme-plain-value" not in page and secret.value_encrypted not in page
    assert "acme-plain-value" not in secret.value_encrypted  # encrypted at rest


@pytest.mark.django_db
def test_secret_set_reads_stdin_and_never_echoes(tenant_a, monkeypatch, capsys):
    import io

    from django.core.management import call_command

    from tools_app.secrets import tenant_secret_values

    monkeypatch.setattr("sys.stdin", io.StringIO("from-stdin-value\n"))
    call_command("secret_set", "PIPE_KEY", "--tenant", tenant_a.slug)
    assert "from-stdin-value" not in capsys.readouterr().out
    assert tenant_secret_values(tenant_a.pk)["PIPE_KEY"] == "from-stdin-value"


@pytest.mark.django_db
def test_a_server_that_is_down_shows_its_status_and_error_in_admin(owner_a_admin, tenant_a):
    from tools_app.mcp.client import MCPError
    from tools_app.mcp.sync import add_server, refresh_server

    server = add_server(tenant_a, "dead", MCPServer.Transport.STDIO, command="/nonexistent/mcp-server")
    with pytest.raises(MCPError):
        refresh_server(server)
    page = owner_a_admin.get(f"{ADMIN}/mcpserver/").content.decode()
    assert "Error" in page and "dead" in page
    server.refresh_from_db()
    from django.utils.html import escape

    assert escape(server.last_error[:40]) in page


@pytest.mark.django_db
def test_the_admin_action_refreshes_and_reports(owner_a_admin, tenant_a):
    from tests.factories import example_stdio_fields
    from tools_app.mcp.sync import add_server

    server = add_server(tenant_a, "example", MCPServer.Transport.STDIO, **example_stdio_fields())
    response = owner_a_admin.post(
        f"{ADMIN}/mcpserver/", {"action": "test_and_refresh", "_selected_action": [server.pk]}, follow=True
    )
    page = response.content.decode()
    assert "xample: connected; 9 tool(s)" in page  # Django capitalizes the first letter of messages
    assert Tool.objects.filter(tenant=tenant_a, mcp_server=server, name="example__add").exists()


@pytest.mark.django_db
def test_a_tenant_admins_only_tenant_is_preselected_on_add_forms(owner_a_admin, tenant_a, tenant_b):
    form = owner_a_admin.get(f"{ADMIN}/mcpserver/add/").context["adminform"].form

    assert list(form.fields["tenant"].queryset) == [tenant_a]
    assert form["tenant"].value() == tenant_a.pk
