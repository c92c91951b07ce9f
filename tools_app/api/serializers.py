from rest_framework import serializers

from ..models import Tool


class ToolSerializer(serializers.ModelSerializer):
    server = serializers.CharField(
        source="mcp_server.name", default=None, allow_null=True, help_text="the MCP server (MCP tools only)"
    )
    enabled = serializers.SerializerMethodField(
        help_text="switched on by an administrator, and so is its MCP server (if any)"
    )

    class Meta:
        model = Tool
        fields = [
            "id",
            "name",
            "description",
            "source",
            "server",
            "risk",
            "read_only",
            "idempotent",
            "enabled",
            "readiness",
            "readiness_reason",
            "updated_at",
        ]
        read_only_fields = fields

    def get_enabled(self, obj) -> bool:
        return obj.enabled and (obj.mcp_server is None or obj.mcp_server.enabled)
