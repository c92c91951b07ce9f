"""Native plan tools: plan_create, plan_update, task_complete.

The plan is a Session fact owned by SessionEngine; these tools only forward the model's
proposal through `ctx.port` (which commits it and emits `plan.updated`) and show the model
the plan as the owner committed it. A model mistake the owner rejects (unknown task id, no
plan yet) should come back from the port as a `ToolError`.
"""

from __future__ import annotations

import json

from approvals_app.choices import Risk

from ..base import Tool, ToolContext, ToolResult

TASK_STATUSES = ["pending", "in_progress", "done", "skipped"]
MAX_TASKS = 50


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


class PlanCreate(Tool):
    name = "plan_create"
    description = (
        "Create the plan for the current task: a title and an ordered list of task titles. "
        "Replaces any previous plan. Returns the plan with task ids to use in plan_update and task_complete."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "title": {"type": "string", "minLength": 1, "maxLength": 200},
            "tasks": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 500},
                "minItems": 1,
                "maxItems": MAX_TASKS,
            },
        },
        "required": ["title", "tasks"],
        "additionalProperties": False,
    }
    risk = Risk.WRITE
    read_only = False
    idempotent = False

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        plan = ctx.port.plan_create(args["title"], list(args["tasks"]))
        return ToolResult(
            content=_compact(plan),
            summary=f"plan: {args['title']} ({len(args['tasks'])} tasks)",
            data={"plan": plan},
        )


class PlanUpdate(Tool):
    name = "plan_update"
    description = (
        "Update tasks of the current plan: set each task's status (pending, in_progress, done, skipped) "
        "and optionally rename it. Returns the updated plan."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "updates": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_TASKS,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": ["string", "integer"], "description": "Task id from the plan."},
                        "status": {"type": "string", "enum": TASK_STATUSES},
                        "title": {"type": "string", "minLength": 1, "maxLength": 500},
                    },
                    "required": ["id", "status"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["updates"],
        "additionalProperties": False,
    }
    risk = Risk.WRITE
    read_only = False
    idempotent = False

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        # Models send ids as numbers as often as strings; the port always gets strings.
        updates = [{**u, "id": str(u["id"])} for u in args["updates"]]
        plan = ctx.port.plan_update(updates)
        n = len(updates)
        return ToolResult(
            content=_compact(plan), summary=f"updated {n} task{'s' if n != 1 else ''}", data={"plan": plan}
        )


class TaskComplete(Tool):
    name = "task_complete"
    description = "Mark a plan task as done with a short summary of what was achieved."
    input_schema = {
        "type": "object",
        "properties": {
            "task_id": {"type": ["string", "integer"], "description": "Task id from the plan."},
            "summary": {"type": "string", "minLength": 1, "maxLength": 2000},
        },
        "required": ["task_id", "summary"],
        "additionalProperties": False,
    }
    risk = Risk.WRITE
    read_only = False
    idempotent = False

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        task_id = str(args["task_id"])
        plan = ctx.port.task_complete(task_id, args["summary"])
        return ToolResult(content=_compact(plan), summary=f"completed task {task_id}", data={"plan": plan})
