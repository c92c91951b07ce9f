"""`skills_find` / `skills_load`: progressive disclosure of Skills (ARCHITECTURE §2). A request
names the Skills a Session may load; `skills_find` searches them, `skills_load` attaches one
(its instructions join every later request; its resources become readable, read-only, under
`skills/<name>/`). Loading a Skill never loads the tools it mentions: tools_select does that."""

from __future__ import annotations

import json

from approvals_app.choices import Risk
from skills_app import catalog

from ..base import Tool, ToolContext, ToolError, ToolResult


class SkillsFind(Tool):
    name = "skills_find"
    description = (
        "Search the Skills (packaged instructions for kinds of tasks) this workspace offers by words "
        "that describe the task. Returns names and descriptions; load one with skills_load."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "minLength": 1,
                "maxLength": 500,
                "description": "words describing the task",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": 20,
                "description": "max results (default 5)",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    risk = Risk.READ
    read_only = True
    idempotent = True

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        loaded = set(ctx.port.loaded_skill_names())
        found = catalog.find(ctx.tenant_id, args["query"], limit=args.get("limit", 5))
        if not found:
            return ToolResult(content=f"No skills match {args['query']!r}.", summary="no matches")
        rows = [
            {
                "id": s.id,
                "name": s.name,
                "description": s.description,
                **({"loaded": True} if s.name in loaded else {}),
            }
            for s in found
        ]
        return ToolResult(
            content=json.dumps(rows, ensure_ascii=False),
            summary=f"{len(rows)} match(es): {', '.join(s.name for s in found)}",
        )


class SkillsLoad(Tool):
    name = "skills_load"
    description = (
        "Load Skills (by name or id, from the offered list or skills_find) into this session: their "
        "instructions appear in your context from the next step, their files under skills/<name>/."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "skills": {
                "type": "array",
                "items": {"type": ["string", "integer"]},
                "minItems": 1,
                "maxItems": 10,
                "description": "Skill names (or ids)",
            }
        },
        "required": ["skills"],
        "additionalProperties": False,
    }
    risk = Risk.WRITE
    read_only = False
    idempotent = True

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        outcome = ctx.port.load_skills([str(ref) for ref in args["skills"]])
        if not outcome["accepted_skill_ids"]:
            reasons = "; ".join(f"{r['skill']}: {r['reason']}" for r in outcome["rejected"])
            raise ToolError(
                f"No skill loaded ({reasons}). Use skills_find to see what exists.", code="unknown_skill"
            )
        names = [entry["name"] for entry in outcome["loaded"]]
        return ToolResult(
            content=json.dumps(
                {
                    **outcome,
                    "note": "Their instructions are in your context from the next step. Tools they "
                    "mention are not loaded by this; use tools_find / tools_select if you need them.",
                },
                ensure_ascii=False,
            ),
            summary=f"loaded {', '.join(names)}"
            + (f" ({len(outcome['rejected'])} refused)" if outcome["rejected"] else ""),
            data={"accepted_skill_ids": outcome["accepted_skill_ids"]},
        )
