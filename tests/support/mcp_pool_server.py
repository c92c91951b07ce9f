"""The example MCP server plus tools that make pooling observable from outside.

    python -m tests.support.mcp_pool_server        # stdio

`process_token` tells which process answered (how many processes a client started);
`counted_pause` counts how many calls run at once in this process (overlap, not timings);
`add_echo_tool` adds a tool at run time and announces that the tool list changed;
`ask` asks the client for input (elicitation) and returns the answer.
Like the example server, it is a separate process speaking only MCP: no Django here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Annotated

from mcp.server.mcpserver import Context, Elicit, ElicitationResult, Resolve
from mcp.types import ToolAnnotations
from pydantic import BaseModel

from tools_app.mcp.example_server import READ_ONLY, main, server

PROCESS_TOKEN = uuid.uuid4().hex
_running = 0
_most_at_once = 0


@server.tool(
    description="A token naming this server process (a pid says little in a pid namespace). Read-only.",
    annotations=READ_ONLY,
    structured_output=False,
)
def process_token() -> str:
    return PROCESS_TOKEN


@server.tool(
    description="Wait `seconds` (max 5); report the most such calls this process ran at once. Read-only.",
    annotations=READ_ONLY,
    structured_output=False,
)
async def counted_pause(seconds: float = 0.3) -> str:
    global _running, _most_at_once
    _running += 1
    _most_at_once = max(_most_at_once, _running)
    try:
        await asyncio.sleep(max(0.0, min(seconds, 5.0)))
    finally:
        _running -= 1
    return json.dumps({"token": PROCESS_TOKEN, "most_at_once": _most_at_once})


@server.tool(
    description="Add a tool named `name` (it echoes its text) to this process, and announce the change.",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
    structured_output=False,
)
async def add_echo_tool(name: str, ctx: Context) -> str:
    def added(text: str) -> str:
        return text

    server.add_tool(
        added, name=name, description=f"Echo, added at run time as {name!r}.", structured_output=False
    )
    await ctx.notify_tools_changed()  # 2026-era clients: their subscriptions/listen stream
    with contextlib.suppress(Exception):  # handshake-era clients: a plain notification
        await ctx.session.send_tool_list_changed()
    return f"added {name!r}"


class Answer(BaseModel):
    answer: str = "none"


def _ask_for_answer(question: str) -> Elicit[Answer]:
    return Elicit(question, Answer)


@server.tool(
    description="Ask the person for an answer (elicitation) and return what came back.",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
    structured_output=False,
)
async def ask(question: str, reply: Annotated[ElicitationResult[Answer], Resolve(_ask_for_answer)]) -> str:
    # A resolver, not ctx.elicit: it asks through whichever channel the protocol era has.
    return f"{reply.action}: {reply.data.answer if reply.action == 'accept' else '-'}"


if __name__ == "__main__":
    main()
