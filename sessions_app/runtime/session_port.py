"""The SessionPort tools use (tools_app.base.SessionPort): each call is a fenced SessionEngine
operation of the runner slice whose SliceContext it serves. Tools that change Session facts
(plans, capabilities, skills, memory, delegation, elicitation) reach them only through it.
"""

from __future__ import annotations

import logging

from skills_app import catalog as skills_catalog
from tools_app.base import ToolError

from ..choices import InputKind
from . import engine, memory
from .llm.tokens import (
    estimate_text_tokens,
)

logger = logging.getLogger(__name__)

# Loaded Skills' instructions may take at most this share of the context budget together.
SKILL_SHARE_OF_BUDGET = 0.25


class RuntimeSessionPort:
    """The SessionPort tools use: each call is a fenced SessionEngine operation of the slice."""

    def __init__(self, context):  # the slice's SliceContext (slice_context.py builds this port)
        self.context = context

    def plan_create(self, title: str, tasks: list[str]) -> dict:
        plan = engine.plan_create(self.context.writer, title, tasks)
        self.context.plan_changed(plan)
        return plan

    def plan_update(self, updates: list[dict]) -> dict:
        try:
            plan = engine.plan_update(self.context.writer, updates)
        except ValueError as exc:  # the model's mistake (no plan, unknown id): a result it can read
            raise ToolError(str(exc), code="invalid_plan_update") from exc
        self.context.plan_changed(plan)
        return plan

    def task_complete(self, task_id: str, summary: str) -> dict:
        return self.plan_update([{"id": task_id, "status": "done"}])

    def file_changed(self, path: str, op: str) -> None:
        # A name is a program's to choose: one a secret went into is announced masked.
        engine.file_changed(self.context.writer, self.context.redactor.redact(path), op)

    def capabilities(self) -> dict:
        return engine.session_capabilities(self.context.session_id)

    def goal_claim(self, status: str, reason: str) -> dict:
        """The agent's claim about the goal of the round it runs. Nothing is written here: the
        call's result, committed like every result before the next model call, is the claim the
        goal driver reads when the round's turn ends."""
        goal_round = self.context.goal_round
        if goal_round is None:
            raise ToolError("update_goal applies only during a goal run's round", code="not_in_goal_run")
        then = (
            "The product checks its own records when this round ends (the round's delivery record, "
            "failed tool calls, open plan tasks, sub-Sessions still working): the run ends done only "
            "if they agree; otherwise the next round names what disagrees."
            if status == "complete"
            else "The run stops when this round ends, with your reason."
        )
        return {
            **goal_round,
            "status": status,
            "reason": reason,
            "recorded": f"{then} Now write your closing answer for this round.",
        }

    def add_capabilities(self, tools: list[str], toolsets: list[str]) -> dict:
        added = engine.add_selected_capabilities(
            self.context.session_id, self.context.token, tools=tools, toolsets=toolsets, added_by="model"
        )
        self.context.writer.forget()  # new tools: the next step re-reads them
        return added

    def load_skills(self, refs: list[str]) -> dict:
        """Attach Skills (add-only): their bodies are in every request from the next step on."""
        context = self.context
        decision = skills_catalog.choose_to_load(
            context.session.tenant_id,
            refs,
            loaded_now=context.loaded_skills,
            room_tokens=int(context.budget * SKILL_SHARE_OF_BUDGET),
            cost=estimate_text_tokens,
        )
        added = {"skills": []}
        if decision.accepted:
            added = engine.add_selected_capabilities(
                context.session_id,
                context.token,
                skills=[skill.name for skill in decision.accepted],
                added_by="model",
            )
            context.writer.forget()  # the next step re-reads its Skills
            # Calls later in this step may already read their resources.
            context.loaded_skill_names = [*context.loaded_skill_names, *added["skills"]]
        return decision.result(added["skills"])

    def loaded_skill_names(self) -> list[str]:
        return list(self.context.loaded_skill_names)

    def _memory_user(self) -> int:
        if self.context.memory_user_id is None:
            raise ToolError(
                "memory is personal to the Session's owner, and someone else wrote into this task: "
                "no memory is read or saved for it",
                code="memory_unavailable",
            )
        return self.context.memory_user_id

    def memory_save(self, text: str, kind: str) -> dict:
        session = self.context.session
        try:
            saved, created = memory.save(
                tenant_id=session.tenant_id,
                user_id=self._memory_user(),
                text=text,
                kind=kind,
                source_session_id=session.pk,
            )
        except memory.MemoryRefused as exc:
            raise ToolError(str(exc), code="memory_refused") from exc
        return {**memory.as_dict(saved), "created": created}

    def delegate(self, *, request: str, files: list[str], session_id, title: str, call_id: str) -> dict:
        """Hand a task to a sub-Session (a MainSession's coordinator tool); its runner is woken
        once the input is committed."""
        return engine.delegate(
            self.context.session_id,
            request=request,
            files=files,
            sub_session_id=session_id,
            title=title,
            call_id=call_id,
        )

    def memory_search(self, query: str, kind: str | None, limit: int) -> list[dict]:
        session = self.context.session
        found = memory.search(
            tenant_id=session.tenant_id, user_id=self._memory_user(), query=query, kind=kind, limit=limit
        )
        return [memory.as_dict(m) for m in found]

    # --- MCP elicitation: SessionEngine's input requests (engine/elicitation.py) ---------------
    # These run in the MCP client's worker thread while the step waits on the tool call; events
    # they write move the Session's seq, so the slice's writer re-reads it at its next commit.

    def request_input(
        self, *, call_id: str, server: str, tool: str, message: str, schema: dict, timeout_seconds: float
    ) -> int:
        request = engine.request_input(
            self.context.session_id,
            self.context.token,
            call_id=call_id,
            server=server,
            tool=tool,
            message=message,
            schema=schema,
            timeout_seconds=timeout_seconds,
        )
        self.context.writer.forget()
        return request.pk

    def input_answer(self, request_id: int) -> dict | None:
        return engine.input_answer(request_id)

    def close_input(self, request_id: int, *, expired: bool) -> dict:
        engine.close_input(request_id, expired=expired)
        self.context.writer.forget()
        return engine.input_answer(request_id) or {"status": "pending", "action": "decline", "content": None}

    def interrupted(self) -> bool:
        return engine.queued_inputs(self.context.session_id, [InputKind.INTERRUPT]).exists()
