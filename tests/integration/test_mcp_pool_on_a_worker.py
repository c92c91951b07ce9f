"""Pooled MCP sessions on the production path: two Sessions of one tenant, driven through the
REST API and run by a real Celery worker process (PostgreSQL, Redis), call a stdio MCP server.
The worker starts ONE server process for both Sessions (the server reports its pid, and the
worker's children are counted in /proc); killing that process makes the next call reconnect;
stopping the worker leaves no server process behind."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from sessions_app.models import Message, Turn
from sessions_app.runtime import engine
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.mcp.sync import add_server, refresh_server
from tools_app.models import MCPServer

from .conftest import wait_for
from .processes import _stop

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

SERVER_MODULE = "tests.support.mcp_pool_server"
PID_TOOL = "pooled__server_pid"


def children_running_the_server(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == parent and SERVER_MODULE in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def _turn(client, worker, session_id: str, text: str, turns_before: int) -> None:
    assert (
        client.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": text}, format="json").status_code
        == 202
    )
    wait_for(
        lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").count() > turns_before, worker
    )
    assert list(Turn.objects.filter(session_id=session_id).values_list("reason", flat=True)) == [
        "completed"
    ] * (turns_before + 1)


def _pids(session_id: str, call_ids: list[str]) -> list[int]:
    results = {m.tool_call_id: m for m in Message.objects.filter(session_id=session_id, role="tool")}
    assert all(not results[i].is_error for i in call_ids), [results[i].content for i in call_ids]
    return [int(results[i].content) for i in call_ids]


def test_two_sessions_share_one_server_process_per_worker(
    tenant_a, api_owner_a, model_config_a, model_server, worker
):
    server = add_server(
        tenant_a, "pooled", MCPServer.Transport.STDIO, command=sys.executable, args=["-m", SERVER_MODULE]
    )
    refresh_server(server)  # one-shot, in this test process: not the worker's pool
    sessions = []
    for title in ("first", "second"):
        session_id = api_owner_a.post("/api/v1/sessions/", {"title": title}, format="json").json()["id"]
        engine.add_selected_capabilities(session_id, None, tools=[PID_TOOL], added_by="test")
        sessions.append(session_id)
    first, second = sessions

    model_server.script(
        "agent",
        *[tool_reply([tool_call(PID_TOOL, {}, id=f"a{i}")]) for i in range(3)],
        text_reply("done"),
    )
    _turn(api_owner_a, worker, first, "which process?", 0)
    model_server.script(
        "agent",
        *[tool_reply([tool_call(PID_TOOL, {}, id=f"b{i}")]) for i in range(3)],
        text_reply("done"),
    )
    _turn(api_owner_a, worker, second, "which process?", 0)

    pids = set(_pids(first, ["a0", "a1", "a2"]) + _pids(second, ["b0", "b1", "b2"]))
    assert len(pids) == 1
    (pooled,) = pids
    assert children_running_the_server(worker.pid) == [pooled]

    os.kill(pooled, signal.SIGKILL)
    model_server.script("agent", tool_reply([tool_call(PID_TOOL, {}, id="c0")]), text_reply("done"))
    _turn(api_owner_a, worker, second, "and now?", 1)

    (replacement,) = _pids(second, ["c0"])
    assert replacement != pooled
    assert children_running_the_server(worker.pid) == [replacement]

    _stop(worker)  # a clean stop closes the pool: the stdio server ends with its worker
    deadline = time.monotonic() + 15
    while Path(f"/proc/{replacement}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{replacement}").exists()
