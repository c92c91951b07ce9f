"""`make bench`: parallel read-only tool calls vs one at a time (example MCP server over HTTP)."""

import sys
import time

import pytest

from tests.integration.processes import free_port, running, wait_for_port
from tools_app.base import ToolContext
from tools_app.catalog import resolve_available
from tools_app.mcp.sync import add_server, refresh_server
from tools_app.models import MCPServer
from tools_app.service import ToolService
from tools_app.workspace import workspace_for

pytestmark = pytest.mark.django_db(transaction=True)


class _Port:
    def file_changed(self, path, op):
        pass


def test_parallel_read_only_batch(tenant_a, tmp_path):
    port = free_port()
    log = tmp_path / "mcp.log"
    with running(
        [sys.executable, "-m", "tools_app.mcp.example_server", "--http", "--port", str(port)], {}, log
    ) as proc:
        wait_for_port(port, proc, log)
        server = add_server(
            tenant_a, "example", MCPServer.Transport.STREAMABLE_HTTP, url=f"http://127.0.0.1:{port}/mcp"
        )
        refresh_server(server)
        tools = resolve_available(tenant_a.pk, ["example__pause"], [])
        ctx = ToolContext(
            session_id="bench",
            tenant_id=tenant_a.pk,
            workspace=workspace_for(tmp_path, "t", "s"),
            port=_Port(),
        )
        calls = [(f"c{i}", "example__pause", '{"label": "x", "seconds": 0.25}') for i in range(4)]
        service = ToolService()
        for parallel in (1, 4):
            started = time.perf_counter()
            outcomes = list(service.execute_batch(calls, ctx, tools, max_parallel=parallel))
            elapsed = (time.perf_counter() - started) * 1000
            assert all(o.ok for o in outcomes)
            print(
                f"\n[bench] 4 read-only MCP calls (0.25 s each), max_parallel={parallel}: {elapsed:7.0f} ms"
            )
