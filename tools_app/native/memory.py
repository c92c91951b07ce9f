"""`memory_save` / `memory_search`: the user's long-term memory across Sessions. The runtime
owns the rows (per user and tenant); these tools only forward through `ctx.port`."""

from __future__ import annotations

import json

from approvals_app.choices import Risk

from ..base import Tool, ToolContext, ToolResult

KINDS = ["entity", "topic", "preference", "constraint", "decision"]


class MemorySave(Tool):
    name = "memory_save"
    description = (
        "Remember something durable about this user's work for later sessions: a preference, a "
        "constraint, a decision, a person/thing (entity) or a topic. One short self-contained fact "
        "per call; never secrets. Saving the same fact again just refreshes it."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": 2000},
            "kind": {"type": "string", "enum": KINDS},
        },
        "required": ["text", "kind"],
        "additionalProperties": False,
    }
    risk = Risk.WRITE
    read_only = False
    # Saving the same text again refreshes the same memory (recovery may re-run it).
    idempotent = True

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        saved = ctx.port.memory_save(args["text"], args["kind"])
        verb = "saved" if saved["created"] else "already remembered"
        return ToolResult(
            content=json.dumps(saved, ensure_ascii=False),
            summary=f"{verb} {saved['kind']} memory {saved['id']}",
            data={"memory_id": saved["id"]},
        )


class MemorySearch(Tool):
    name = "memory_search"
    description = "Search this user's memories from earlier sessions by words (optionally one kind)."
    input_schema = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "maxLength": 500},
            "kind": {"type": "string", "enum": KINDS},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    risk = Risk.READ
    read_only = True
    idempotent = True

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        found = ctx.port.memory_search(args["query"], args.get("kind"), args.get("limit", 10))
        if not found:
            return ToolResult(content="No memories match.", summary="no memories")
        return ToolResult(content=json.dumps(found, ensure_ascii=False), summary=f"{len(found)} memories")
