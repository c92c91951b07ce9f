"""stdio MCP servers run a command on the host, so only operators may configure them.

Rows from before that rule carry no record of who set their command: every one is disabled
with a reason an admin sees, until a superuser reviews the command and saves the server
(or re-adds it with `manage.py mcp_server add`). HTTP servers stay enabled; as tenant
endpoints they now pass the outbound guard.
"""

from django.db import migrations

REASON = (
    "Disabled by a security update: a stdio server runs a command on the host, so only an "
    "operator may configure it. A superuser can review the command and save the server to "
    "enable it again (or re-add it with manage.py mcp_server add)."
)


def disable_unapproved_stdio(apps, schema_editor):
    MCPServer = apps.get_model("tools_app", "MCPServer")
    MCPServer.objects.filter(transport="stdio", configured_by_operator=False).update(
        enabled=False, disabled_reason=REASON
    )


class Migration(migrations.Migration):
    dependencies = [("tools_app", "0002_mcpserver_operator_flag")]

    operations = [migrations.RunPython(disable_unapproved_stdio, migrations.RunPython.noop)]
