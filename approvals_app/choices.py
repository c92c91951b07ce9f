"""The approval vocabulary, and the tool vocabulary approval rules match on.

`Risk` and `ToolSource` are facts of tools (tools_app), but approval rules match on them and
approvals_app sits below tools_app (ARCHITECTURE §10), so this is the lowest app that needs
them: they are defined here, once, and tools_app and sessions_app import them from here.
Their values are stored (tool rows, rules, approvals) and named by CONTRACT: never rename them.
"""

from django.db import models


class Risk(models.TextChoices):
    READ = "read", "Read"
    WRITE = "write", "Write"
    DESTRUCTIVE = "destructive", "Destructive"
    EXTERNAL = "external", "External"


class ToolSource(models.TextChoices):
    NATIVE = "native", "Native"
    MCP = "mcp", "MCP server"


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"


class PolicyAction(models.TextChoices):
    ALLOW = "allow", "Allow"
    REQUIRE_APPROVAL = "require_approval", "Require approval"
    DENY = "deny", "Deny"
