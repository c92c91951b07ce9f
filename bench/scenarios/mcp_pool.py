"""MCP call overhead, pooled vs one-shot: milliseconds per `call_tool` of the example server's
`echo` (no work on the server side), over stdio (a sandboxed child process) and Streamable HTTP (a server
process on loopback).

Pooled: the process's pooled session, opened once before timing (what a worker does after its
first call). One-shot: a new connection per call (`pooled=False`), for stdio a new process.
"""

from __future__ import annotations

import time

from ..figures import figure
from ..harness import median_of_runs
from .parallel_tools import example_server

POOLED_CALLS, ONE_SHOT_CALLS = 50, 5


def run(options: dict) -> dict:
    from tools_app.mcp.client import STREAMABLE_HTTP, Connection, connection_for
    from tools_app.mcp.pool import close_pool
    from tools_app.mcp.stdio import python_module_launch
    from tools_app.mcp.sync import add_server
    from tools_app.models import MCPServer

    from ..harness import new_owner

    pooled_n = 10 if options["quick"] else POOLED_CALLS
    one_shot_n = 2 if options["quick"] else ONE_SHOT_CALLS
    tenant, _ = new_owner("mcp-pool")
    launch = python_module_launch("tools_app.mcp.example_server")
    server = add_server(
        tenant,
        "bench",
        MCPServer.Transport.STDIO,
        command=launch.command,
        args=launch.args,
        env=launch.env,
        sandbox_read_paths=launch.read_paths,
    )
    stdio = connection_for(server, {})  # in the process sandbox, as every stdio server runs
    runs = []
    with example_server() as url:
        http = Connection(server_name="bench-http", transport=STREAMABLE_HTTP, url=url, timeout=60)
        for _ in range(options["runs"]):
            runs.append(
                {
                    "stdio_pooled_ms": per_call_ms(stdio, pooled_n, pooled=True),
                    "stdio_one_shot_ms": per_call_ms(stdio, one_shot_n, pooled=False),
                    "http_pooled_ms": per_call_ms(http, pooled_n, pooled=True),
                    "http_one_shot_ms": per_call_ms(http, one_shot_n, pooled=False),
                }
            )
        close_pool()
    for each in runs:
        each["stdio_ratio"] = each["stdio_one_shot_ms"] / each["stdio_pooled_ms"]
        each["http_ratio"] = each["http_one_shot_ms"] / each["http_pooled_ms"]
    return {
        "figures": [
            figure(f"stdio, pooled ({pooled_n} calls)", median_of_runs(runs, "stdio_pooled_ms"), "ms/call"),
            figure(
                f"stdio, one-shot ({one_shot_n} calls)", median_of_runs(runs, "stdio_one_shot_ms"), "ms/call"
            ),
            figure("stdio, one-shot / pooled", median_of_runs(runs, "stdio_ratio"), "×"),
            figure(f"HTTP, pooled ({pooled_n} calls)", median_of_runs(runs, "http_pooled_ms"), "ms/call"),
            figure(
                f"HTTP, one-shot ({one_shot_n} calls)", median_of_runs(runs, "http_one_shot_ms"), "ms/call"
            ),
            figure("HTTP, one-shot / pooled", median_of_runs(runs, "http_ratio"), "×"),
        ],
        "details": runs,
    }


def per_call_ms(conn, calls: int, *, pooled: bool) -> float:
    from tools_app.mcp.client import call_tool

    if pooled:
        call_tool(conn, "echo", {"text": "warm-up"}, read_only=True, pooled=True)  # opens the session
    started = time.perf_counter()
    for i in range(calls):
        result = call_tool(conn, "echo", {"text": f"call {i}"}, read_only=True, pooled=pooled)
        assert result.text == f"call {i}", result.text
    return (time.perf_counter() - started) * 1000 / calls
