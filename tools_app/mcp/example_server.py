"""A small MCP server shipped with the product, for tests and the demo (SCENARIOS S5).

    python -m tools_app.mcp.example_server                          # stdio
    python -m tools_app.mcp.example_server --http --port 8765       # Streamable HTTP at /mcp

It is a separate process speaking only MCP, so it must not import Django. `save_note` writes
only inside a temporary directory of its own; `show_auth` echoes the credential it received
(the `Authorization` header over HTTP, `EXAMPLE_TOKEN` over stdio) so redaction can be tested.
`ask_preference` asks the person a question mid-call (elicitation) and returns what it got.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Annotated, Literal

from mcp.server.elicitation import ElicitationResult
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)

server = MCPServer(
    "xagent-example",
    instructions="Example tools of the xAgent workspace: echo, arithmetic, word counts, notes.",
    version="1.0",
    log_level="WARNING",
)

_notes_dir: Path | None = None


def _notes() -> Path:
    global _notes_dir
    if _notes_dir is None:
        _notes_dir = Path(tempfile.mkdtemp(prefix="xagent-example-notes-"))
    return _notes_dir


@server.tool(description="Return the text unchanged.", annotations=READ_ONLY, structured_output=False)
def echo(text: str) -> str:
    return text


@server.tool(
    description="Add two numbers.",
    annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False),
    structured_output=False,
)
def add(a: float, b: float) -> str:
    total = a + b
    return str(int(total)) if float(total).is_integer() else str(total)


@server.tool(description="Count the words in a text.", annotations=READ_ONLY, structured_output=False)
def word_count(text: str) -> str:
    return str(len(text.split()))


@server.tool(
    description="Save a note (kept in the example server's own temporary directory).",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
    structured_output=False,
)
def save_note(title: str, body: str) -> str:
    slug = re.sub(r"[^a-zA-Z0-9_-]+", "-", title).strip("-")[:60] or "note"
    path = _notes() / f"{slug}.txt"
    path.write_text(body, encoding="utf-8")
    return f"saved note {slug!r} ({len(body)} characters)"


@server.tool(
    description="Always fail with the given message (an error result).",
    annotations=READ_ONLY,
    structured_output=False,
)
def fail(message: str) -> str:
    raise ToolError(message)


@server.tool(
    description="Show the credential this server received (Authorization header or EXAMPLE_TOKEN).",
    annotations=READ_ONLY,
    structured_output=False,
)
def show_auth(ctx: Context) -> str:
    headers = ctx.headers
    if headers is not None:
        return headers.get("authorization", "")
    return os.environ.get("EXAMPLE_TOKEN", "")


@server.tool(
    description="Wait `seconds` (max 5), then report when the wait started and ended. Read-only.",
    annotations=READ_ONLY,
    structured_output=False,
)
async def pause(label: str, seconds: float = 0.3) -> str:
    started = time.time()
    await asyncio.sleep(max(0.0, min(seconds, 5.0)))
    return json.dumps({"label": label, "started": started, "ended": time.time()})


@server.tool(
    description="Like pause, but declared as changing state (not read-only): it must never overlap other calls.",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
    structured_output=False,
)
async def pause_and_write(label: str, seconds: float = 0.3) -> str:
    started = time.time()
    await asyncio.sleep(max(0.0, min(seconds, 5.0)))
    return json.dumps({"label": label, "started": started, "ended": time.time()})


class Preference(BaseModel):
    """What `ask_preference` asks: one field of each kind an elicitation form can have."""

    name: str = Field(description="Who is answering", min_length=1, max_length=100)
    drink: Literal["coffee", "tea", "water"] = Field(description="The drink to bring")
    cups: int = Field(default=2, ge=1, le=10, description="How many cups")
    sugar: bool = Field(default=False, description="With sugar")


def _ask_about(topic: str) -> Elicit[Preference]:
    # A resolver, not `ctx.elicit`: the SDK then asks the way the negotiated protocol wants
    # (a server-to-client request mid-call, or an input-required result the client retries).
    return Elicit(f"Drinks for {topic}: what should I bring?", Preference)


@server.tool(
    description="Ask the person which drink to bring (an elicitation), and return their answer.",
    annotations=READ_ONLY,
    structured_output=False,
)
async def ask_preference(
    topic: str, answer: Annotated[ElicitationResult[Preference], Resolve(_ask_about)]
) -> str:
    if answer.action == "accept":
        return json.dumps({"action": "accept", "content": answer.data.model_dump()}, sort_keys=True)
    return json.dumps({"action": answer.action})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--http", action="store_true", help="serve Streamable HTTP at /mcp instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    options = parser.parse_args(argv)
    if options.http:
        server.run("streamable-http", host=options.host, port=options.port)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
