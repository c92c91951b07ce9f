from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools_app"
    verbose_name = "Tools"

    def ready(self):
        from django.db.models.signals import post_delete, post_migrate

        from approvals_app.policy import register_rule_vocabulary, register_tool_facts
        from tenancy_app.audit import track_changes
        from tenancy_app.versioning import track_configuration

        from .catalog import policy_facts_for, rule_vocabulary
        from .models import MCPServer, SandboxPolicy, Secret, Tool, ToolSet

        post_migrate.connect(_sync_native_tools, sender=self)
        # Every way a server row goes (the admin, a cascade from its tenant) takes its directory.
        post_delete.connect(_remove_server_directory, sender=MCPServer)
        # approvals_app sits below tools_app: its "Test a call" reads a tool's facts through this port.
        register_tool_facts(policy_facts_for)
        register_rule_vocabulary(rule_vocabulary)  # the rule editor's tool and tool set suggestions
        track_configuration(MCPServer, ToolSet, Tool, SandboxPolicy, Secret)
        track_changes(MCPServer, ToolSet, Tool, SandboxPolicy, Secret)
        # The MCP SDK is not imported here (about a second of every process start): the pool and
        # the client load it with the first MCP connection.


def _sync_native_tools(sender, **kwargs):
    """Keep the global Tool rows in step with the code registry after every migrate/flush."""
    from .catalog import sync_native_tools

    sync_native_tools()


def _remove_server_directory(sender, instance, **kwargs):
    from django.db import transaction

    from .mcp.stdio import remove_server_directory

    tenant_id, server_id = instance.tenant_id, instance.pk
    transaction.on_commit(lambda: remove_server_directory(tenant_id, server_id))
