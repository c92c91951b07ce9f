"""The outer task loop (ARCHITECTURE §2): what Brain does, in a sub-Session, between committing a
message and the first step of its turn (the Session shows `preparing`).

    the message is already committed (start_turn: it can never be lost after this)
     -> one stateless `task_relation` call (understanding.py), validated strictly
     -> the deterministic transition sets the goals; `task.understood`
     -> initialize / reconcile only: recall Skills, tools and memories, one `orchestrate` call,
        `add_selected_capabilities` (atomic, add-only); `capabilities.added`
     -> `running`: the inner loop

Any failure of a stage (the call fails or times out, its answer is invalid, recall breaks) is an
`error` event; the goals and capabilities stay as they were and the turn runs anyway. An
interrupt stops the preparation like a step (the turn ends `aborted` at the next boundary). A
runner lost meanwhile leaves the turn `preparing`, and the next runner prepares it again: each
call is stateless, and what was added stays (add-only).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from skills_app import catalog as skills_catalog
from tools_app.catalog import resolve_available

from ..choices import InputKind
from ..models import Input, ModelCall, Session
from . import engine, orchestrator, understanding
from .llm.base import Cancelled, ModelCallFailed, ModelResult
from .llm.config import EffectiveModel, resolve_model
from .llm.tokens import context_budget, estimate_message_tokens, estimate_text_tokens
from .session_port import SKILL_SHARE_OF_BUDGET

logger = logging.getLogger(__name__)

UNCHANGED = "the goals and capabilities are unchanged and the turn runs anyway"
# Orchestration fails after task understanding has set the goals.
CAPABILITIES_UNCHANGED = (
    "the capabilities are unchanged (the goals task understanding set stand) and the turn runs anyway"
)


@dataclass
class _Asked:
    """An outer-loop call that was asked: its evidence row, what came back, and either the
    validated answer or why there is none."""

    call: ModelCall
    result: ModelResult | None = None
    answer: object = None
    error: str = ""


def prepare_turn(agent, turn_id: int) -> None:
    """Run the outer loop for the open turn `turn_id` of the agent's Session; its last commit lets
    the turn's steps begin. `agent` (AgentService) lends its lease token and its interrupt watch."""
    session_id = agent.session_id
    session = Session.objects.select_related("model_config").get(pk=session_id)
    model = resolve_model(session)
    payload = (
        Input.objects.filter(turn_id=turn_id, kind=InputKind.MESSAGE)
        .order_by("id")
        .values_list("payload", flat=True)
        .first()
    ) or {}
    # A goal run's first round is understood from the person's goal, not its framing.
    text = str(payload.get("goal") or payload.get("text", ""))
    agent.watch_interrupts()
    try:
        _prepare(agent, session, turn_id, model, text, payload.get("attachments") or [])
    except Cancelled:
        pass  # the queued interrupt is applied at the next boundary
    finally:
        agent.invalidate()  # goals and capabilities may have changed: the first step re-reads


def _prepare(agent, session, turn_id, model: EffectiveModel, text: str, resources: list[str]) -> None:
    session_id, token = agent.session_id, agent.token
    asked_for = understanding.request_payload(
        text=text, resources=resources, phase_goal=session.phase_goal, session_goal=session.session_goal
    )
    messages = understanding.request_messages(asked_for)
    asked = _ask(
        agent,
        turn_id,
        purpose="task_relation",
        model=model.with_max_output(understanding.MAX_ANSWER_TOKENS),
        instructions=understanding.INSTRUCTIONS,
        payload=asked_for,
        messages=messages,
        ask=lambda: understanding.understand(model, messages, agent.cancel),
        invalid=understanding.UnderstandingInvalid,
    )
    if asked.answer is None:
        _failed(agent, turn_id, asked, "task_relation_failed", "task understanding", UNCHANGED)
        return
    understood = asked.answer
    step = understanding.transition(
        understood.task_relation, text=text, phase_goal=session.phase_goal, session_goal=session.session_goal
    )
    session = engine.apply_understanding(
        session_id,
        token,
        turn_id=turn_id,
        call=asked.call,
        result=asked.result,
        understanding=understood.as_dict(),
        phase_goal=step.phase_goal,
        session_goal=step.session_goal,
        mode=step.mode,
    )
    if step.mode is not None:
        _orchestrate(agent, session, turn_id, model, text, understood, step.mode)


def _orchestrate(agent, session, turn_id, model: EffectiveModel, text, understood, mode: str) -> None:
    """Recall, one orchestrate call, and the add-only merge of what it chose."""
    session_id, token, tenant_id = agent.session_id, agent.token, session.tenant_id
    try:
        attached = engine.session_capabilities(session_id)
        available = resolve_available(tenant_id, attached["tools"], attached["toolsets"])
        candidates = orchestrator.recall(
            tenant_id=tenant_id,
            understanding=understood,
            loaded_skills=attached["skills"],
            available_tools=list(available),
            attached_toolsets=attached["toolsets"],
            memory_user_id=engine.memory_user_id(session, engine.turn_author_ids(turn_id)),
        )
    except Exception as exc:  # recall is ours: a bug must not cost the user the turn
        logger.exception("session %s: recall failed", session_id)
        engine.preparation_failed(
            session_id,
            token,
            turn_id=turn_id,
            call=None,
            result=None,
            error="",
            code="orchestration_failed",
            message=f"orchestration failed: recall broke ({exc.__class__.__name__}); {CAPABILITIES_UNCHANGED}",
        )
        return
    chosen = {"skills": [], "toolsets": [], "tools": []}
    asked = None
    if candidates.selectable:
        asked_for = orchestrator.request_payload(
            mode=mode,
            text=text,
            goals={"session_goal": session.session_goal, "phase_goal": session.phase_goal},
            loaded={
                "skills": attached["skills"],
                "toolsets": attached["toolsets"],
                "tools": sorted(available),
            },
            candidates=candidates,
        )
        messages = orchestrator.request_messages(asked_for)
        asked = _ask(
            agent,
            turn_id,
            purpose="orchestrate",
            model=model.with_max_output(orchestrator.MAX_ANSWER_TOKENS),
            instructions=orchestrator.INSTRUCTIONS,
            payload=asked_for,
            messages=messages,
            ask=lambda: orchestrator.select(model, messages, candidates, agent.cancel),
            invalid=orchestrator.SelectionInvalid,
        )
        if asked.answer is None:
            _failed(agent, turn_id, asked, "orchestration_failed", "orchestration", CAPABILITIES_UNCHANGED)
            return
        chosen = asked.answer.as_dict()
    # Loaded Skills' instructions share a bounded part of the context (as with skills_load).
    budget = context_budget(model.context_window, model.max_output_tokens)
    decision = skills_catalog.choose_to_load(
        tenant_id,
        chosen["skills"],
        loaded_now=skills_catalog.loaded(tenant_id, attached["skills"]),
        room_tokens=int(budget * SKILL_SHARE_OF_BUDGET),
        cost=estimate_text_tokens,
    )
    engine.commit_orchestration(
        session_id,
        token,
        turn_id=turn_id,
        mode=mode,
        call=asked.call if asked is not None else None,
        result=asked.result if asked is not None else None,
        candidates={**candidates.names(), "memories": len(candidates.memory_ids)},
        chosen=chosen,
        skills=[skill.name for skill in decision.accepted],
        refused=decision.rejected,
        memory_ids=candidates.memory_ids,
    )


def _ask(agent, turn_id, *, purpose, model, instructions, payload, messages, ask, invalid) -> _Asked:
    """One outer-loop call behind its evidence row. Raises Cancelled (an interrupt; the row says
    so) and LeaseLost; any other failure is in the returned `error`."""
    session_id, token = agent.session_id, agent.token
    asked = _Asked(
        engine.begin_preparation_call(
            session_id,
            token,
            turn_id=turn_id,
            purpose=purpose,
            model=model,
            instructions=instructions,
            payload=payload,
            request_tokens=sum(estimate_message_tokens(m) for m in messages),
        )
    )
    try:
        asked.answer, asked.result = ask()
    except Cancelled:
        engine.interrupted_preparation(session_id, token, asked.call)
        raise
    except ModelCallFailed as exc:
        asked.result = ModelResult(
            finish_reason="error", attempts=exc.attempts, attempt_errors=exc.attempt_errors
        )
        asked.error = f"the {purpose} call failed ({exc})"
    except invalid as exc:
        asked.result, asked.error = getattr(exc, "result", None), f"invalid answer: {exc}"
    except engine.LeaseLost:
        raise
    except Exception as exc:
        logger.exception("session %s: %s call broke", session_id, purpose)
        asked.error = f"internal error ({exc.__class__.__name__})"
    return asked


def _failed(agent, turn_id: int, asked: _Asked, code: str, what: str, unchanged: str) -> None:
    engine.preparation_failed(
        agent.session_id,
        agent.token,
        turn_id=turn_id,
        call=asked.call,
        result=asked.result,
        error=asked.error,
        code=code,
        message=f"{what} failed: {asked.error}; {unchanged}",
    )
