"""Read-only calls of one response overlap; a state-changing call is a barrier; results commit
in model order. Observed through the timestamps the example MCP server reports (no timing asserts)."""

import json
import sys

import pytest

from sessions_app.models import Message, Turn
from sessions_app.runtime import engine
from tests.integration.processes import free_port, running, wait_for_port
from tests.runtime.helpers import drive_until_idle, new_session, send
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.mcp.sync import add_server, refresh_server
from tools_app.models import MCPServer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def example_url(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("mcp") / "example.log"
    with running(
        [sys.executable, "-m", "tools_app.mcp.example_server", "--http", "--port", str(port)], {}, log
    ) as proc:
        wait_for_port(port, proc, log)
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture
def session(tenant_a, owner_a, model_config_a, example_url):
    server = add_server(tenant_a, "example", MCPServer.Transport.STREAMABLE_HTTP, url=example_url)
    refresh_server(server)
    session = new_session(tenant_a, owner_a)
    engine.add_selected_capabilities(
        session.pk, None, tools=["example__pause", "example__pause_and_write"], added_by="test"
    )
    return session


def _windows(session, ids):
    results = {m.tool_call_id: m for m in Message.objects.filter(session=session, role="tool")}
    return {i: json.loads(results[i].content) for i in ids}


def test_four_reads_overlap_and_commit_in_model_order(session, model_server):
    reads = [tool_call("example__pause", {"label": f"r{i}", "seconds": 0.4}, id=f"r{i}") for i in range(4)]
    model_server.script("agent", tool_reply(reads), text_reply("done"))
    send(session, "pause four times")
    drive_until_idle(session)

    windows = _windows(session, [f"r{i}" for i in range(4)])
    assert max(w["started"] for w in windows.values()) < min(
        w["ended"] for w in windows.values()
    )  # all overlapped
    order = list(
        Message.objects.filter(session=session, role="tool")
        .order_by("id")
        .values_list("tool_call_id", flat=True)
    )
    assert order == ["r0", "r1", "r2", "r3"]
    assert Turn.objects.get(session=session).reason == "completed"


def test_a_state_changing_call_is_a_barrier(session, model_server):
    calls = [
        tool_call("example__pause", {"label": "a", "seconds": 0.3}, id="a"),
        tool_call("example__pause", {"label": "b", "seconds": 0.3}, id="b"),
        tool_call("example__pause_and_write", {"label": "w", "seconds": 0.3}, id="w"),
        tool_call("example__pause", {"label": "c", "seconds": 0.3}, id="c"),
        tool_call("example__pause", {"label": "d", "seconds": 0.3}, id="d"),
    ]
    model_server.script("agent", tool_reply(calls), text_reply("done"))
    send(session, "pause around a write")
    drive_until_idle(session)

    w = _windows(session, ["a", "b", "w", "c", "d"])
    assert w["a"]["started"] < w["b"]["ended"] and w["b"]["started"] < w["a"]["ended"]  # a, b overlap
    assert w["w"]["started"] >= max(w["a"]["ended"], w["b"]["ended"])  # the write waits for both
    assert min(w["c"]["started"], w["d"]["started"]) >= w["w"]["ended"]  # and nothing runs beside it
    assert w["c"]["started"] < w["d"]["ended"] and w["d"]["started"] < w["c"]["ended"]  # c, d overlap again
    order = list(
        Message.objects.filter(session=session, role="tool")
        .order_by("id")
        .values_list("tool_call_id", flat=True)
    )
    assert order == ["a", "b", "w", "c", "d"]


def test_schema_invalid_arguments_are_refused_before_the_server_is_called(session, model_server):
    model_server.script(
        "agent",
        tool_reply([tool_call("example__pause", {"label": 5, "seconds": "soon"}, id="bad")]),
        text_reply("ok"),
    )
    send(session, "pause wrongly")
    drive_until_idle(session)
    result = Message.objects.get(session=session, tool_call_id="bad")
    assert result.is_error and "validate" in result.content and "label" in result.content
