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

from skills_app import catalog as skills_catalog
from tools_app.catalog import resolve_available

from ..models import Input, Session
from . import engine, orchestrator, understanding
from .agent import SKILL_SHARE_OF_BUDGET
from .llm.base import Cancelled, ModelCallFailed, ModelResult
from .llm.config import EffectiveModel, resolve_model
from .llm.tokens import context_budget, estimate_message_tokens, estimate_text_tokens

logger = logging.getLogger(__name__)

UNCHANGED = "the goals and capabilities are unchanged and the turn runs anyway"


def prepare_turn(agent, turn_id: int) -> None:
    """Run the outer loop for the open turn `turn_id` of the agent's Session, then let its steps
    begin. `agent` (AgentService) lends its lease token and its interrupt watch."""
    session_id, token = agent.session_id, agent.token
    session = Session.objects.select_related("model_config").get(pk=session_id)
    model = resolve_model(session)
    request = engine.turn_request(turn_id)
    payload = (
        Input.objects.filter(pk=request.input_id).values_list("payload", flat=True).first()
        if request is not None
        else None
    ) or {}
    text = str(payload.get("text", ""))
    agent.watch_interrupts()
    try:
        understood = _understand(agent, session, turn_id, model, text, payload.get("attachments") or [])
        if understood is not None:
            step = understanding.transition(
                understood.task_relation,
                text=text,
                phase_goal=session.phase_goal,
                session_goal=session.session_goal,
            )
            session = engine.apply_understanding(
                session_id,
                token,
                turn_id=turn_id,
                understanding=understood.as_dict(),
                phase_goal=step.phase_goal,
                session_goal=step.session_goal,
                mode=step.mode,
            )
            if step.mode is not None:
                _orchestrate(agent, session, turn_id, model, text, understood, step.mode)
    except Cancelled:
        return  # the queued interrupt is applied at the next boundary
    finally:
        agent.invalidate()  # goals and capabilities may have changed: the first step re-reads
    engine.finish_preparation(session_id, token, turn_id)


def _understand(agent, session, turn_id, model: EffectiveModel, text: str, resources: list[str]):
    """The task-relation call and its validation; None (and an `error` event) when it failed."""
    payload = understanding.request_payload(
        text=text, resources=resources, phase_goal=session.phase_goal, session_goal=session.session_goal
    )
    messages = understanding.request_messages(payload)
    outcome = _call(
        agent,
        turn_id,
        purpose="task_relation",
        model=model.with_max_output(understanding.MAX_ANSWER_TOKENS),
        instructions=understanding.INSTRUCTIONS,
        payload=payload,
        messages=messages,
        ask=lambda: understanding.understand(model, messages, agent.cancel),
        invalid=understanding.UnderstandingInvalid,
        failure_code="task_relation_failed",
        what="task understanding",
    )
    return outcome


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
        engine.report_preparation_failure(
            session_id,
            token,
            turn_id=turn_id,
            code="orchestration_failed",
            message=f"orchestration failed: recall broke ({exc.__class__.__name__}); {UNCHANGED}",
        )
        return
    if candidates.memory_ids:
        engine.add_recalled_memories(session_id, token, turn_id=turn_id, memory_ids=candidates.memory_ids)
    chosen = {"skills": [], "toolsets": [], "tools": []}
    if candidates.selectable:
        payload = orchestrator.request_payload(
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
        messages = orchestrator.request_messages(payload)
        selection = _call(
            agent,
            turn_id,
            purpose="orchestrate",
            model=model.with_max_output(orchestrator.MAX_ANSWER_TOKENS),
            instructions=orchestrator.INSTRUCTIONS,
            payload=payload,
            messages=messages,
            ask=lambda: orchestrator.select(model, messages, candidates, agent.cancel),
            invalid=orchestrator.SelectionInvalid,
            failure_code="orchestration_failed",
            what="orchestration",
        )
        if selection is None:
            return
        chosen = selection.as_dict()
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
        candidates={**candidates.names(), "memories": len(candidates.memory_ids)},
        chosen=chosen,
        skills=[skill.name for skill in decision.accepted],
        refused=decision.rejected,
    )


def _call(
    agent, turn_id, *, purpose, model, instructions, payload, messages, ask, invalid, failure_code, what
):
    """One outer-loop call with its evidence row: the validated answer, or None after an `error`
    event saying what went wrong. Raises Cancelled (an interrupt) and LeaseLost."""
    session_id, token = agent.session_id, agent.token
    call = engine.begin_preparation_call(
        session_id,
        token,
        turn_id=turn_id,
        purpose=purpose,
        model=model,
        instructions=instructions,
        payload=payload,
        request_tokens=sum(estimate_message_tokens(m) for m in messages),
    )
    try:
        answer, result = ask()
    except Cancelled:
        engine.end_preparation_call(
            session_id, token, call, result=None, error="interrupted by the user", finish_reason="cancelled"
        )
        raise
    except ModelCallFailed as exc:
        failed = ModelResult(finish_reason="error", attempts=exc.attempts, attempt_errors=exc.attempt_errors)
        engine.end_preparation_call(session_id, token, call, result=failed, error=str(exc))
        reason = f"the {purpose} call failed ({exc})"
    except invalid as exc:
        engine.end_preparation_call(
            session_id, token, call, result=getattr(exc, "result", None), error=str(exc)
        )
        reason = f"invalid answer: {exc}"
    except engine.LeaseLost:
        raise
    except Exception as exc:
        logger.exception("session %s: %s call broke", session_id, purpose)
        engine.end_preparation_call(session_id, token, call, result=None, error=f"internal error: {exc!r}")
        reason = f"internal error ({exc.__class__.__name__})"
    else:
        engine.end_preparation_call(session_id, token, call, result=result, answer=answer.as_dict())
        return answer
    engine.report_preparation_failure(
        session_id, token, turn_id=turn_id, code=failure_code, message=f"{what} failed: {reason}; {UNCHANGED}"
    )
    return None
