"""`MCPTool`: a Tool row of an MCP server, as ToolService runs it.

The row is the product's decision about the tool (name, risk, flags, schema); the server row
is read fresh at each call, so a changed URL, header or secret applies at once. Redaction of
what comes back is the caller's job (ToolService/runtime); this module only makes sure its
own error messages never carry a secret value.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import connection as db_connection

from approvals_app.choices import Risk
from config.dbconn import hand_back_connections
from tools_app.base import Tool, ToolContext, ToolError, ToolResult
from tools_app.models import MCPServer
from tools_app.secrets import tenant_secret_values

from .client import AuthorizationRequired, ElicitAnswer, ElicitHandler, MCPError, call_tool, connection_for
from .sync import record_server_error, record_server_ok

SUMMARY_CHARS = 160
# How often a waiting elicitation re-reads its request (the answer may come from another process).
ELICITATION_POLL_SECONDS = 0.25

logger = logging.getLogger(__name__)


class MCPTool(Tool):
    def __init__(
        self,
        *,
        name: str,
        description: str,
        input_schema: dict,
        risk: str,
        read_only: bool,
        idempotent: bool,
        server_id: int,
        server_name: str,
        remote_name: str,
    ):
        self.name = name
        self.description = description
        self.input_schema = input_schema or {"type": "object", "properties": {}}
        self.risk = Risk(risk)
        self.read_only = read_only
        self.idempotent = idempotent
        self.server_id = server_id
        self.server_name = server_name
        self.remote_name = remote_name

    @classmethod
    def from_row(cls, row) -> MCPTool:
        """Build from a `tools_app.models.Tool` row whose source is MCP."""
        if row.mcp_server_id is None:
            raise ValueError(f"tool {row.name!r} is not provided by an MCP server")
        return cls(
            name=row.name,
            description=row.description,
            input_schema=row.input_schema,
            risk=row.risk,
            read_only=row.read_only,
            idempotent=row.idempotent,
            server_id=row.mcp_server_id,
            server_name=row.mcp_server.name,
            remote_name=row.remote_name,
        )

    def __repr__(self) -> str:
        return f"<MCPTool {self.name} -> {self.server_name}:{self.remote_name}>"

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        # Scoped by the calling Session's tenant: a row of another tenant's server never runs.
        server = MCPServer.objects.for_tenant(ctx.tenant_id).filter(pk=self.server_id).first()
        if server is None:
            raise ToolError(
                f"the MCP server {self.server_name!r} of this tool no longer exists", code="tool_unavailable"
            )
        if not server.enabled:
            raise ToolError(f"the MCP server {server.name!r} is disabled", code="tool_unavailable")
        try:
            conn = connection_for(server, tenant_secret_values(server.tenant_id))
            hand_back_connections()  # the call is a wait: the process's few connections serve others
            remote = call_tool(
                conn,
                self.remote_name,
                args,
                timeout=server.timeout_seconds,
                read_only=self.read_only,
                on_elicit=self._elicitation_handler(ctx, server.name),
            )
        except MCPError as exc:
            # One failed call says the server is in trouble, not that its tools are gone:
            # they stay offered until a refresh finds out.
            record_server_error(server, str(exc), tools_unavailable=False)
            # A missing OAuth consent is not the model's to fix: the message names who can.
            code = "mcp_authorization_required" if isinstance(exc, AuthorizationRequired) else "mcp_error"
            raise ToolError(str(exc), code=code, stage="runtime") from None
        record_server_ok(server)
        where = f"{server.name}:{self.remote_name}"
        first_line = remote.text.strip().split("\n", 1)[0] if remote.text.strip() else ""
        if len(first_line) > SUMMARY_CHARS:
            first_line = first_line[: SUMMARY_CHARS - 1] + "…"
        verb = "failed" if remote.is_error else "returned"
        summary = f"{where} {verb}: {first_line}" if first_line else f"{where} {verb} nothing"
        content = (
            remote.text
            if remote.text
            else ("(error without a message)" if remote.is_error else "(no output)")
        )
        data = {"server": server.name, "tool": self.remote_name}
        return ToolResult(content=content, summary=summary, is_error=remote.is_error, data=data)

    def _elicitation_handler(self, ctx: ToolContext, server_name: str) -> ElicitHandler | None:
        """The server's questions during this call become input requests of the Session, answered
        by a person; without a Session that can hold them (a port lacking the operations), the
        client declines them as unsupported."""
        port = ctx.port
        if not hasattr(port, "request_input"):
            return None

        def on_elicit(message: str, schema: dict) -> ElicitAnswer:
            # Runs in the MCP client's worker thread: its own database connection, closed here.
            try:
                return _wait_for_person(port, ctx.call_id, server_name, self.name, message, schema)
            finally:
                db_connection.close()

        return on_elicit


def _wait_for_person(port, call_id: str, server: str, tool: str, message: str, schema: dict) -> ElicitAnswer:
    """Commit the request, then poll until someone answers, the deadline passes (expired: the
    server is told decline) or the turn is interrupted (cancelled: told cancel)."""
    timeout = float(settings.XAGENT_ELICITATION_TIMEOUT_SECONDS)
    request_id = port.request_input(
        call_id=call_id, server=server, tool=tool, message=message, schema=schema, timeout_seconds=timeout
    )
    deadline = time.monotonic() + timeout
    while True:
        answer = port.input_answer(request_id)
        if answer is None:
            if port.interrupted():
                answer = port.close_input(request_id, expired=False)
            elif time.monotonic() >= deadline:
                answer = port.close_input(request_id, expired=True)
        if answer is not None:
            logger.info("input request %s answered %s (%s)", request_id, answer["action"], answer["status"])
            return ElicitAnswer(action=answer["action"] or "decline", content=answer.get("content"))
        hand_back_connections()  # a person may take minutes: the connection serves others meanwhile
        time.sleep(ELICITATION_POLL_SECONDS)
