"""`update_goal`: during a goal run, the agent's own claim about the goal (CONTRACT "Native tools").

The claim is committed as this call's result before the agent writes its closing answer (the
xAgent / DeepSeek Harness way: the claim first, then the product checks it). The goal driver reads
it when the round's turn ends and weighs it against the product's own records: `blocked` stops
the run with the agent's reason; `complete` ends it `done` only when the records agree (the
round's delivery record clean, no unresolved failure, no open plan task, no sub-Session still
working), else the next round names each disagreement. The runtime offers the tool only in a
goal run's rounds.
"""

from __future__ import annotations

import json

from approvals_app.choices import Risk

from ..base import Tool, ToolContext, ToolResult

GOAL_TOOL = "update_goal"
CLAIMS = ("complete", "blocked")


class UpdateGoal(Tool):
    name = GOAL_TOOL
    description = (
        "Goal runs only: say where the goal stands. status `complete` when the goal is met (the "
        "product then checks its own records: delivered files and their checks, failed tool calls, "
        "open plan tasks, sub-Sessions still working; if they disagree the run goes on and the next "
        "round names what disagrees); status `blocked` when you cannot go on without a person (the "
        "run stops with your reason). Give the reason in one or two sentences. After calling it, "
        "write your closing answer for the round. Not calling it means the goal is not reached yet."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": list(CLAIMS)},
            "reason": {"type": "string", "minLength": 1, "maxLength": 2000},
        },
        "required": ["status", "reason"],
        "additionalProperties": False,
    }
    risk = Risk.WRITE  # it changes a fact (how the run ends), like saving a memory
    read_only = False
    idempotent = True  # the last claim of a round counts: saying it twice changes nothing

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        claim = ctx.port.goal_claim(args["status"], args["reason"].strip())
        return ToolResult(
            content=json.dumps(claim, ensure_ascii=False),
            summary=f"goal {args['status']}: {args['reason'].strip()[:200]}",
            data={"claim": claim},
        )
