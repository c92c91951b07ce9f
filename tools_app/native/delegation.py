"""`session_delegate`: a MainSession hands a task to a sub-Session (ARCHITECTURE §2).

The sub-Session gets the original request and the resources only (files copied into its
workspace); it understands the task and chooses its Skills and tools itself. The call returns at
once; the sub-Session's result arrives later in this Session as a session event."""

from __future__ import annotations

import json

from approvals_app.choices import Risk

from ..base import Tool, ToolContext, ToolResult


class SessionDelegate(Tool):
    name = "session_delegate"
    description = (
        "Hand a task to a sub-Session, which works on it on its own (MainSession only). Give the "
        "user's original request in their words and the workspace files it needs; do not tell it "
        "which skills or tools to use. Returns at once; its final answer and delivered files come "
        "back to this Session as a session event when it finishes. Pass session_id to send a "
        "follow-up to a sub-Session you started before."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "request": {"type": "string", "minLength": 1, "maxLength": 100000, "description": "the task"},
            "files": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 1000},
                "maxItems": 50,
                "description": "workspace paths of files the task needs (copied to the sub-Session)",
            },
            "session_id": {"type": "string", "maxLength": 64, "description": "an earlier sub-Session's id"},
            "title": {
                "type": "string",
                "maxLength": 200,
                "description": "a short title for a new sub-Session",
            },
        },
        "required": ["request"],
        "additionalProperties": False,
    }
    risk = Risk.WRITE
    read_only = False
    idempotent = False

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        handed = ctx.port.delegate(
            request=args["request"],
            files=args.get("files") or [],
            session_id=args.get("session_id") or None,
            title=args.get("title") or "",
            call_id=ctx.call_id,
        )
        verb = "sent to" if handed["reused"] else "started"
        return ToolResult(
            content=json.dumps(
                {
                    **handed,
                    "note": "The sub-Session works on its own; its result arrives here as a session "
                    "event when it finishes. Tell the user what you delegated.",
                },
                ensure_ascii=False,
            ),
            summary=f"{verb} sub-Session {handed['title']!r}"
            + (f" with {len(handed['files'])} file(s)" if handed["files"] else ""),
            data={"session_id": handed["session_id"]},
        )
