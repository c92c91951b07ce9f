"""Parallel read-only tools vs serial: one step whose response asks for four calls of 200 ms
each to the example MCP server (Streamable HTTP, a process of its own). `example__pause` is
read-only, so the four may overlap; `example__pause_and_write` does the same but declares that
it changes state, so each call must finish before the next starts.

The figure is the step's wall time (model call to model call, in this process): the four calls
plus the harness around them.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.integration.processes import free_port, running, wait_for_port

from ..figures import figure
from ..harness import (
    add_default_tools,
    median_of_runs,
    new_owner,
    new_session,
    run_turn_in_process,
    step_intervals,
)
from ..models import directive_message

CALLS = 4
PAUSE_S = 0.2
READ_ONLY, STATE_CHANGING = "example__pause", "example__pause_and_write"


def run(options: dict) -> dict:
    tenant, owner = new_owner("parallel")
    with example_server() as url:
        register_example_server(tenant, url)
        measure_step(tenant, owner, READ_ONLY)  # warm-up: the MCP session, imports
        runs = [
            {
                "parallel_ms": measure_step(tenant, owner, READ_ONLY),
                "serial_ms": measure_step(tenant, owner, STATE_CHANGING),
            }
            for _ in range(options["runs"])
        ]
    for each in runs:
        each["ratio"] = each["serial_ms"] / each["parallel_ms"]
    calls = f"{CALLS} calls × {PAUSE_S * 1000:.0f} ms"
    return {
        "figures": [
            figure(f"read-only ({calls}), step wall time", median_of_runs(runs, "parallel_ms"), "ms"),
            figure(f"state-changing ({calls}), step wall time", median_of_runs(runs, "serial_ms"), "ms"),
            figure("serial / parallel", median_of_runs(runs, "ratio"), "×"),
        ],
        "details": runs,
    }


@contextmanager
def example_server() -> Iterator[str]:
    """The example MCP server over Streamable HTTP until the block ends; yields its URL."""
    port = free_port()
    log = Path(tempfile.mkdtemp()) / "example-mcp.log"
    command = [sys.executable, "-m", "tools_app.mcp.example_server", "--http", "--port", str(port)]
    with running(command, {}, log) as proc:
        wait_for_port(port, proc, log)
        yield f"http://127.0.0.1:{port}/mcp"


def register_example_server(tenant, url: str) -> None:
    from tools_app.mcp.sync import add_server, refresh_server
    from tools_app.models import MCPServer

    refresh_server(add_server(tenant, "example", MCPServer.Transport.STREAMABLE_HTTP, url=url))
    add_default_tools(tenant, [READ_ONLY, STATE_CHANGING])


def measure_step(tenant, owner, tool: str) -> float:
    """Milliseconds of the one step that makes the four calls."""
    plan = [[{"name": tool, "arguments": {"label": f"c{i}", "seconds": PAUSE_S}} for i in range(CALLS)]]
    run_turn_in_process(new_session(tenant, owner, tool), directive_message(1, plan), 1)
    millis, _ = step_intervals()
    return millis[0]
