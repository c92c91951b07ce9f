"""Pooled MCP sessions against real server processes (tests/support/mcp_pool_server.py, stdio).

What the server reports (its pid, how many calls it ran at once) is the evidence; nothing here
asserts a duration.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from tools_app.base import ToolContext
from tools_app.mcp.client import STDIO, Connection, ElicitAnswer, MCPError, call_tool, list_tools
from tools_app.mcp.pool import get_pool, pool_key
from tools_app.mcp.sync import add_server, refresh_server
from tools_app.mcp.tool import MCPTool
from tools_app.models import MCPServer, Tool

SERVER_MODULE = "tests.support.mcp_pool_server"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def pool_connection(**changes) -> Connection:
    conn = Connection(
        server_name="pooled",
        transport=STDIO,
        command=sys.executable,
        args=("-m", SERVER_MODULE),
        env={"PATH": os.environ.get("PATH", os.defpath)},
        cwd=str(PROJECT_ROOT),
        timeout=20,
        tenant_id=1,
        server_id=1,
    )
    return dataclasses.replace(conn, **changes)


def pid_of(conn: Connection) -> int:
    return int(call_tool(conn, "server_pid", {}, read_only=True).text)


def server_processes() -> list[int]:
    """This process's children running the pool server (a real count, not the server's word)."""
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
        if int(ppid) == os.getpid() and SERVER_MODULE in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def pooled_sessions(conn: Connection) -> list[dict]:
    tenant, server, name, _ = pool_key(conn)
    return [
        s
        for s in get_pool().sessions()
        if (s["tenant_id"], s["server_id"], s["server_name"]) == (tenant, server, name)
    ]


def test_fifty_calls_start_one_process_and_a_killed_one_is_replaced():
    conn = pool_connection()
    connects = get_pool().connects

    pids = {pid_of(conn) for _ in range(50)}

    assert len(pids) == 1
    assert server_processes() == list(pids)
    assert get_pool().connects == connects + 1
    [session] = pooled_sessions(conn)
    assert session["calls"] == 50 and session["open"]

    (killed,) = pids
    os.kill(killed, signal.SIGKILL)
    replacement = pid_of(conn)  # the next call reconnects and succeeds

    assert replacement != killed
    assert get_pool().connects == connects + 2
    assert server_processes() == [replacement]


def test_a_dead_stdio_process_is_noticed_without_a_call():
    conn = pool_connection()
    killed = pid_of(conn)
    os.kill(killed, signal.SIGKILL)
    # The session's subscriptions/listen stream ends with the process: the pool drops it by itself.
    deadline = time.monotonic() + 20
    while pooled_sessions(conn) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pooled_sessions(conn) == []
    assert pid_of(conn) != killed


def test_parallel_read_only_calls_overlap_on_one_pooled_session():
    conn = pool_connection()
    pid = pid_of(conn)  # the session is open before the calls start together
    start = threading.Barrier(4)
    results = []

    def read():
        start.wait()
        results.append(json.loads(call_tool(conn, "counted_pause", {"seconds": 1.0}, read_only=True).text))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert {r["pid"] for r in results} == {pid}
    assert max(r["most_at_once"] for r in results) == 4
    assert len(pooled_sessions(conn)) == 1


def test_state_changing_calls_take_turns_on_a_pooled_session():
    conn = pool_connection()
    start = threading.Barrier(3)
    results = []

    def write():
        start.wait()
        # counted_pause declared as changing state by the caller: such calls never overlap.
        results.append(json.loads(call_tool(conn, "counted_pause", {"seconds": 0.3}, read_only=False).text))

    threads = [threading.Thread(target=write) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len({r["pid"] for r in results}) == 1
    assert max(r["most_at_once"] for r in results) == 1


def test_a_timed_out_call_does_not_break_the_next_one():
    conn = pool_connection()
    pid = pid_of(conn)
    connects = get_pool().connects

    with pytest.raises(MCPError, match="did not answer within 0.5 seconds while calling the tool 'pause'"):
        call_tool(conn, "pause", {"label": "slow", "seconds": 4}, timeout=0.5, read_only=True)

    assert pid_of(conn) == pid
    assert call_tool(conn, "echo", {"text": "still here"}, read_only=True).text == "still here"
    assert get_pool().connects == connects
    [session] = pooled_sessions(conn)
    assert session["in_flight"] == 0


def test_tenants_never_share_a_pooled_session():
    of_a = pool_connection(tenant_id=101)
    of_b = pool_connection(tenant_id=202)  # the very same server configuration, another tenant

    pid_a, pid_b = pid_of(of_a), pid_of(of_b)

    assert pid_a != pid_b
    keys = {(s["tenant_id"], s["fingerprint"]) for s in get_pool().sessions()}
    assert (101, pool_key(of_a)[3]) in keys and (202, pool_key(of_b)[3]) in keys
    assert pool_key(of_a)[3] == pool_key(of_b)[3]  # only the tenant tells them apart


def test_a_changed_configuration_opens_a_new_session_and_retires_the_old():
    conn = pool_connection()
    old_pid = pid_of(conn)
    changed = pool_connection(env={**conn.env, "EXAMPLE_TOKEN": "rotated"})  # say, a secret rotated

    assert call_tool(changed, "show_auth", {}, read_only=True).text == "rotated"

    [session] = pooled_sessions(changed)
    assert session["fingerprint"] == pool_key(changed)[3]
    deadline = time.monotonic() + 20
    while old_pid in server_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert old_pid not in server_processes()


def test_a_server_that_keeps_failing_gets_a_clear_error_at_once():
    conn = pool_connection(command="/nonexistent/mcp-server")
    connects = get_pool().connects

    with pytest.raises(MCPError, match="the command '/nonexistent/mcp-server' was not found") as first:
        call_tool(conn, "echo", {"text": "x"})
    with pytest.raises(MCPError) as second:
        call_tool(conn, "echo", {"text": "x"})

    assert str(first.value) in str(second.value)
    assert "Not retried yet: 1 attempt to connect failed" in str(second.value)
    assert get_pool().connects == connects
    assert pooled_sessions(conn) == []


def test_an_elicitation_reaches_the_handler_of_its_own_call():
    conn = pool_connection()
    asked = []

    def answer(message: str, schema: dict) -> ElicitAnswer:
        asked.append((message, sorted(schema.get("properties", {}))))
        return ElicitAnswer("accept", {"answer": "blue"})

    # A read-only call without a handler is in flight on the same session meanwhile.
    reader = threading.Thread(
        target=call_tool, args=(conn, "counted_pause", {"seconds": 1.0}), kwargs={"read_only": True}
    )
    pid_of(conn)
    reader.start()
    result = call_tool(conn, "ask", {"question": "Favourite colour?"}, on_elicit=answer)
    reader.join()

    assert result.text == "accept: blue"
    assert asked == [("Favourite colour?", ["answer"])]
    assert len(pooled_sessions(conn)) == 1


def test_an_elicitation_during_a_call_without_a_handler_is_declined():
    assert call_tool(pool_connection(), "ask", {"question": "Anyone?"}).text == "decline: -"


def test_probe_style_listing_stays_one_shot_unless_pooled():
    conn = pool_connection()
    connects = get_pool().connects

    names = {tool.name for tool in list_tools(conn)}

    assert {"server_pid", "counted_pause", "add_echo_tool"} <= names
    assert get_pool().connects == connects and pooled_sessions(conn) == []
    assert {tool.name for tool in list_tools(conn, pooled=True)} == names
    assert get_pool().connects == connects + 1


@pytest.mark.django_db(transaction=True)
def test_a_server_that_changes_its_tools_gets_its_rows_refreshed(tenant_a, tmp_path):
    server = add_server(
        tenant_a, "pooled", MCPServer.Transport.STDIO, command=sys.executable, args=["-m", SERVER_MODULE]
    )
    refresh_server(server)
    assert not Tool.objects.filter(name="pooled__late_echo").exists()
    ctx = ToolContext(session_id="s", tenant_id=tenant_a.pk, workspace=tmp_path, port=None)
    add_tool = MCPTool.from_row(Tool.objects.select_related("mcp_server").get(name="pooled__add_echo_tool"))

    assert add_tool.run(ctx, {"name": "late_echo"}).content == "added 'late_echo'"

    deadline = time.monotonic() + 20  # the refresh runs in a thread of the pool, debounced
    while not Tool.objects.filter(name="pooled__late_echo").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    row = Tool.objects.select_related("mcp_server").get(name="pooled__late_echo")
    assert row.tenant_id == tenant_a.pk and row.readiness == "ready"
    # The new tool exists only in the pooled process that announced it: it runs there.
    assert MCPTool.from_row(row).run(ctx, {"text": "hello"}).content == "hello"
