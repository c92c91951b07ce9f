"""`tools_find` / `tools_select`: on-demand tool discovery. A tool the model reads about (in a
Skill, say) is not callable until selected; selection is add-only and recorded on the Session."""

from __future__ import annotations

import json

from approvals_app.choices import Risk

from ..base import Tool, ToolContext, ToolError, ToolResult


class ToolsFind(Tool):
    name = "tools_find"
    description = (
        "Search the tools and tool sets this workspace allows but this session has not loaded yet, "
        "by words in their name or description. Load the ones you need with tools_select."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 500, "description": "search terms"}
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    risk = Risk.READ
    read_only = True
    idempotent = True

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        from ..catalog import find

        loaded = ctx.port.capabilities()
        exclude = set(loaded.get("tools", [])) | set(loaded.get("toolsets", []))
        found = find(ctx.tenant_id, args["query"], exclude)
        if not found:
            return ToolResult(content=f"No tools match {args['query']!r}.", summary="no matches")
        return ToolResult(content=json.dumps(found, ensure_ascii=False), summary=f"{len(found)} match(es)")


class ToolsSelect(Tool):
    name = "tools_select"
    description = "Load tools or tool sets (by name, from tools_find) into this session so you can call them."
    input_schema = {
        "type": "object",
        "properties": {
            "names": {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "minItems": 1,
                "maxItems": 20,
            }
        },
        "required": ["names"],
        "additionalProperties": False,
    }
    risk = Risk.WRITE
    read_only = False
    idempotent = True

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        from ..catalog import known_names

        tools, toolsets, unknown = known_names(ctx.tenant_id, args["names"])
        if unknown:
            raise ToolError(
                f"Unknown or disabled: {', '.join(unknown)}. Use tools_find to see what can be loaded.",
                code="unknown_capability",
            )
        added = ctx.port.add_capabilities(tools, toolsets)
        names = [*added.get("tools", []), *added.get("toolsets", [])]
        summary = f"loaded {', '.join(names)}" if names else "already loaded"
        return ToolResult(content=json.dumps({"added": added}), summary=summary)
