"""An MCP server over Streamable HTTP whose `export_report` tool never answers by itself: it
hangs until the test creates the release file (a remote system that stopped responding).

    python -m tests.support.stuck_mcp_server --port 8766 --record calls.log --release release.flag

Every call appends one line (`started <job>`) to the record file as it starts, so a test can
see that the call is in flight and count how many times it ran (never twice), and a second line
(`released <job>`) when it answers at last.
A separate process speaking only MCP, like the example server: no Django here.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("xagent-stuck", log_level="WARNING")

_record: Path | None = None
_release: Path | None = None


@server.tool(
    description="Export the quarterly report to the archive (changes state: not read-only).",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True),
    structured_output=False,
)
async def export_report(job: str) -> str:
    with _record.open("a") as record:
        record.write(f"started {job}\n")
    while not _release.exists():
        await asyncio.sleep(0.1)
    with _record.open("a") as record:
        record.write(f"released {job}\n")
    return f"exported {job}"


def main(argv: list[str] | None = None) -> None:
    global _record, _release
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--release", type=Path, required=True)
    options = parser.parse_args(argv)
    _record, _release = options.record, options.release
    server.run("streamable-http", host=options.host, port=options.port)


if __name__ == "__main__":
    main()
