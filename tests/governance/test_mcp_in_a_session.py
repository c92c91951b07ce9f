"""S5 on the real loop: an MCP server's tools, refreshed, found with tools_find, loaded with
tools_select and called by the model; the evidence names the server and the tool."""

import json

import pytest

from sessions_app.models import Message, SessionEvent, Turn
from tests.factories import example_stdio_fields
from tests.runtime.helpers import drive_until_idle, new_session, send
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.mcp.sync import add_server, refresh_server
from tools_app.models import MCPServer

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_session_finds_loads_and_calls_an_mcp_tool(tenant_a, owner_a, model_config_a, model_server):
    server = add_server(tenant_a, "example", MCPServer.Transport.STDIO, **example_stdio_fields())
    names = sorted(t.name for t in refresh_server(server).tools)
    assert "example__add" in names
    session = new_session(tenant_a, owner_a)
    model_server.script(
        "agent",
        tool_reply([tool_call("example__add", {"a": 1, "b": 2}, id="too-early")]),
        tool_reply([tool_call("tools_find", {"query": "add"}, id="find")]),
        tool_reply([tool_call("tools_select", {"names": ["example__add"]}, id="select")]),
        tool_reply([tool_call("example__add", {"a": 1, "b": 2}, id="add")]),
        text_reply("1 + 2 = 3"),
    )
    send(session, "add 1 and 2 with a tool")
    drive_until_idle(session)

    results = {m.tool_call_id: m for m in Message.objects.filter(session=session, role="tool")}
    assert results["too-early"].is_error and "not available in this session" in results["too-early"].content
    assert any(
        item["name"] == "example__add" and item.get("server") == "example"
        for item in json.loads(results["find"].content)
    )
    assert not results["add"].is_error and results["add"].content.strip().endswith("3")
    ended = SessionEvent.objects.get(session=session, type="tool.ended", data__call_id="add")
    assert ended.data["source"] == {"server": "example", "tool": "add"}
    assert Turn.objects.get(session=session).reason == "completed"


def test_a_server_that_is_down_gives_a_clear_result_and_a_visible_status(
    tenant_a, owner_a, model_config_a, model_server
):
    server = add_server(tenant_a, "example", MCPServer.Transport.STDIO, **example_stdio_fields())
    refresh_server(server)
    session = new_session(tenant_a, owner_a)
    from sessions_app.runtime import engine

    engine.add_selected_capabilities(session.pk, None, tools=["example__echo"], added_by="test")
    MCPServer.objects.filter(pk=server.pk).update(command="/nonexistent/mcp-server")
    model_server.script(
        "agent", tool_reply([tool_call("example__echo", {"text": "hi"}, id="echo")]), text_reply("it is down")
    )
    send(session, "echo hi")
    drive_until_idle(session)

    result = Message.objects.get(session=session, tool_call_id="echo")
    assert result.is_error and "example" in result.content
    server.refresh_from_db()
    assert server.status == "error" and server.last_error
    assert Turn.objects.get(session=session).reason == "completed"
