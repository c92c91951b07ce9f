"""Pooled MCP sessions on the production path: two Sessions of one tenant, driven through the
REST API and run by a real Celery worker process (PostgreSQL, Redis), call a sandboxed stdio MCP
server. The worker starts ONE server process for both Sessions (the server names its process
with a token, and the worker's descendants are counted in /proc); killing that process makes
the next call reconnect; stopping the worker leaves no server process behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from sessions_app.models import Message, Turn
from sessions_app.runtime import engine
from tests.mcp.test_pool import add_pool_server, server_processes
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.mcp.sync import refresh_server

from .conftest import wait_for
from .processes import _stop, database_env_for_workers, running, worker_command

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

TOKEN_TOOL = "pooled__process_token"


@pytest.fixture
def worker(tmp_path, mcp_servers_dir):
    """A real worker whose stdio servers get their directories where the sandbox uid can reach."""
    log = tmp_path / "worker.log"
    env = database_env_for_workers() | {"XAGENT_MCP_SERVERS_DIR": str(mcp_servers_dir)}
    with running(worker_command("mcp-pool"), env, log) as proc:
        proc.log_path = log
        yield proc


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


def _tokens(session_id: str, call_ids: list[str]) -> list[str]:
    results = {m.tool_call_id: m for m in Message.objects.filter(session_id=session_id, role="tool")}
    assert all(not results[i].is_error for i in call_ids), [results[i].content for i in call_ids]
    return [results[i].content for i in call_ids]


def test_two_sessions_share_one_server_process_per_worker(
    tenant_a, api_owner_a, model_config_a, model_server, worker
):
    refresh_server(add_pool_server(tenant_a))  # one-shot, in this test process: not the worker's pool
    sessions = []
    for title in ("first", "second"):
        session_id = api_owner_a.post("/api/v1/sessions/", {"title": title}, format="json").json()["id"]
        engine.add_selected_capabilities(session_id, None, tools=[TOKEN_TOOL], added_by="test")
        sessions.append(session_id)
    first, second = sessions

    for session_id, prefix in ((first, "a"), (second, "b")):
        model_server.script(
            "agent",
            *[tool_reply([tool_call(TOKEN_TOOL, {}, id=f"{prefix}{i}")]) for i in range(3)],
            text_reply("done"),
        )
        _turn(api_owner_a, worker, session_id, "which process?", 0)

    tokens = set(_tokens(first, ["a0", "a1", "a2"]) + _tokens(second, ["b0", "b1", "b2"]))
    assert len(tokens) == 1
    [pid] = server_processes(worker.pid)

    os.kill(pid, signal.SIGKILL)
    model_server.script("agent", tool_reply([tool_call(TOKEN_TOOL, {}, id="c0")]), text_reply("done"))
    _turn(api_owner_a, worker, second, "and now?", 1)

    assert _tokens(second, ["c0"])[0] not in tokens
    [replacement] = server_processes(worker.pid)
    assert replacement != pid

    _stop(worker)  # a clean stop closes the pool: the stdio server ends with its worker
    deadline = time.monotonic() + 15
    while Path(f"/proc/{replacement}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{replacement}").exists()
