"""Pooled MCP sessions against real server processes (tests/support/mcp_pool_server.py over
stdio, in the process sandbox like every stdio server).

What the server reports (a token naming its process, how many calls it ran at once) and the
processes found in /proc are the evidence; nothing here asserts a duration.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tools_app.base import ToolContext
from tools_app.mcp.client import Connection, ElicitAnswer, MCPError, call_tool, connection_for, list_tools
from tools_app.mcp.pool import get_pool, pool_key
from tools_app.mcp.stdio import python_module_launch
from tools_app.mcp.sync import add_server, refresh_server
from tools_app.mcp.tool import MCPTool
from tools_app.models import MCPServer, Tool

pytestmark = pytest.mark.django_db

SERVER_MODULE = "tests.support.mcp_pool_server"


def pool_server_fields() -> dict:
    """`add_server` arguments running the pool server sandboxed: its package and tools_app (it
    extends the example server) bound read-only, as `--python-module` would record."""
    launch = python_module_launch(SERVER_MODULE)
    example = python_module_launch("tools_app.mcp.example_server")
    # Both packages' parents: the same directory in a checkout, two when each is a copy (a
    # private checkout run as root, config/sandbox_reach.py).
    paths = [*launch.env["PYTHONPATH"].split(os.pathsep), *example.env["PYTHONPATH"].split(os.pathsep)]
    return {
        "command": launch.command,
        "args": launch.args,
        "env": {**launch.env, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))},
        "sandbox_read_paths": sorted(set(launch.read_paths) | set(example.read_paths)),
    }


def add_pool_server(tenant, name: str = "pooled") -> MCPServer:
    return add_server(tenant, name, MCPServer.Transport.STDIO, **pool_server_fields())


@pytest.fixture
def conn(tenant_a) -> Connection:
    return connection_for(add_pool_server(tenant_a), {})


def token_of(conn: Connection) -> str:
    return call_tool(conn, "process_token", {}, read_only=True).text


def server_processes(root: int | None = None) -> list[int]:
    """Host pids of pool-server processes below `root` (this process): a real count."""
    root = os.getpid() if root is None else root
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        table[int(entry.name)] = (int(ppid), state, [a.decode(errors="replace") for a in argv])

    def below_root(pid: int) -> bool:
        while pid in table and pid > 1:
            pid = table[pid][0]
            if pid == root:
                return True
        return False

    return sorted(
        pid
        for pid, (_, state, argv) in table.items()
        if state != "Z"
        and len(argv) > 2
        and os.path.basename(argv[0]).startswith("python")
        and argv[1:3] == ["-m", SERVER_MODULE]
        and below_root(pid)
    )


def wait_until(predicate, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)


def pooled_sessions(conn: Connection) -> list[dict]:
    tenant, server, name, _ = pool_key(conn)
    return [
        s
        for s in get_pool().sessions()
        if (s["tenant_id"], s["server_id"], s["server_name"]) == (tenant, server, name)
    ]


def test_fifty_calls_start_one_process_and_a_killed_one_is_replaced(conn):
    connects = get_pool().connects

    tokens = {token_of(conn) for _ in range(50)}

    assert len(tokens) == 1
    [pid] = server_processes()
    assert get_pool().connects == connects + 1
    [session] = pooled_sessions(conn)
    assert session["calls"] == 50 and session["open"]

    os.kill(pid, signal.SIGKILL)
    replacement = token_of(conn)  # the next call reconnects and succeeds

    assert replacement not in tokens
    assert get_pool().connects == connects + 2
    [new_pid] = server_processes()
    assert new_pid != pid


def test_a_dead_stdio_process_is_noticed_without_a_call(conn):
    killed = token_of(conn)
    [pid] = server_processes()
    os.kill(pid, signal.SIGKILL)
    # The session's subscriptions/listen stream ends with the process: the pool drops it by itself.
    wait_until(lambda: not pooled_sessions(conn))
    assert pooled_sessions(conn) == []
    assert token_of(conn) != killed


def test_parallel_read_only_calls_overlap_on_one_pooled_session(conn):
    token = token_of(conn)  # the session is open before the calls start together
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

    assert {r["token"] for r in results} == {token}
    assert max(r["most_at_once"] for r in results) == 4
    assert len(pooled_sessions(conn)) == 1 and len(server_processes()) == 1


def test_state_changing_calls_take_turns_on_a_pooled_session(conn):
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

    assert len({r["token"] for r in results}) == 1
    assert max(r["most_at_once"] for r in results) == 1


def test_a_timed_out_call_does_not_break_the_next_one(conn):
    token = token_of(conn)
    connects = get_pool().connects

    with pytest.raises(MCPError, match="did not answer within 0.5 seconds while calling the tool 'pause'"):
        call_tool(conn, "pause", {"label": "slow", "seconds": 4}, timeout=0.5, read_only=True)

    assert token_of(conn) == token
    assert call_tool(conn, "echo", {"text": "still here"}, read_only=True).text == "still here"
    assert get_pool().connects == connects
    [session] = pooled_sessions(conn)
    assert session["in_flight"] == 0


def test_tenants_never_share_a_pooled_session(tenant_a, tenant_b):
    of_a = connection_for(add_pool_server(tenant_a), {})
    of_b = connection_for(add_pool_server(tenant_b), {})
    # Even one configuration to the byte (say, copied across tenants) is not shared.
    of_b_same_config = dataclasses.replace(of_a, tenant_id=tenant_b.pk)

    tokens = {token_of(of_a), token_of(of_b), token_of(of_b_same_config)}

    assert len(tokens) == 3 and len(server_processes()) == 3
    sessions = {(s["tenant_id"], s["fingerprint"]) for s in get_pool().sessions()}
    assert sessions == {
        (tenant_a.pk, pool_key(of_a)[3]),
        (tenant_b.pk, pool_key(of_b)[3]),
        (tenant_b.pk, pool_key(of_a)[3]),
    }


def test_a_changed_configuration_opens_a_new_session_and_retires_the_old(conn):
    token_of(conn)
    [old_pid] = server_processes()
    changed = dataclasses.replace(conn, env={**conn.env, "EXAMPLE_TOKEN": "rotated"})  # a secret rotated

    assert call_tool(changed, "show_auth", {}, read_only=True).text == "rotated"

    [session] = pooled_sessions(changed)
    assert session["fingerprint"] == pool_key(changed)[3]
    wait_until(lambda: old_pid not in server_processes())
    assert old_pid not in server_processes() and len(server_processes()) == 1


def test_a_server_that_keeps_failing_gets_a_clear_error_at_once(tenant_a):
    server = add_server(tenant_a, "broken", MCPServer.Transport.STDIO, command="/nonexistent/mcp-server")
    conn = connection_for(server, {})
    connects = get_pool().connects

    with pytest.raises(MCPError, match="the command '/nonexistent/mcp-server' was not found") as first:
        call_tool(conn, "echo", {"text": "x"})
    with pytest.raises(MCPError) as second:
        call_tool(conn, "echo", {"text": "x"})

    assert str(first.value) in str(second.value)
    assert "Not retried yet: 1 attempt to connect failed" in str(second.value)
    assert get_pool().connects == connects
    assert pooled_sessions(conn) == []


def test_an_elicitation_reaches_the_handler_of_its_own_call(conn):
    asked = []

    def answer(message: str, schema: dict) -> ElicitAnswer:
        asked.append((message, sorted(schema.get("properties", {}))))
        return ElicitAnswer("accept", {"answer": "blue"})

    # A read-only call without a handler is in flight on the same session meanwhile.
    reader = threading.Thread(
        target=call_tool, args=(conn, "counted_pause", {"seconds": 1.0}), kwargs={"read_only": True}
    )
    token_of(conn)
    reader.start()
    result = call_tool(conn, "ask", {"question": "Favourite colour?"}, on_elicit=answer)
    reader.join()

    assert result.text == "accept: blue"
    assert asked == [("Favourite colour?", ["answer"])]
    assert len(pooled_sessions(conn)) == 1


def test_an_elicitation_during_a_call_without_a_handler_is_declined(conn):
    assert call_tool(conn, "ask", {"question": "Anyone?"}).text == "decline: -"


def test_listing_stays_one_shot_unless_pooled(conn):
    connects = get_pool().connects

    names = {tool.name for tool in list_tools(conn)}

    assert {"process_token", "counted_pause", "add_echo_tool"} <= names
    assert get_pool().connects == connects and pooled_sessions(conn) == []
    assert {tool.name for tool in list_tools(conn, pooled=True)} == names
    assert get_pool().connects == connects + 1


@pytest.mark.django_db(transaction=True)
def test_a_server_that_changes_its_tools_gets_its_rows_refreshed(tenant_a, tmp_path):
    server = add_pool_server(tenant_a)
    refresh_server(server)
    assert not Tool.objects.filter(name="pooled__late_echo").exists()
    ctx = ToolContext(session_id="s", tenant_id=tenant_a.pk, workspace=tmp_path, port=None)
    add_tool = MCPTool.from_row(Tool.objects.select_related("mcp_server").get(name="pooled__add_echo_tool"))

    assert add_tool.run(ctx, {"name": "late_echo"}).content == "added 'late_echo'"

    # The refresh runs in a thread of the pool, debounced: no admin action.
    wait_until(lambda: Tool.objects.filter(name="pooled__late_echo").exists())
    row = Tool.objects.select_related("mcp_server").get(name="pooled__late_echo")
    assert row.tenant_id == tenant_a.pk and row.readiness == "ready"
    # The new tool exists only in the pooled process that announced it: it runs there.
    assert MCPTool.from_row(row).run(ctx, {"text": "hello"}).content == "hello"
