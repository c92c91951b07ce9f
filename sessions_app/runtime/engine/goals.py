"""Goals and the outer task loop's facts: the session and phase goals (set by task understanding
or by a person, never by what a model writes), the `preparing` phase of a turn, and the
evidence of the outer loop's stateless calls."""

from __future__ import annotations

from django.db.models import F
from django.utils import timezone

from ...choices import SessionStatus
from ...models import ModelCall, Session, Turn
from ..events import emit
from .context import prompt_blob
from .fencing import locked_session
from .sessions import _add_capabilities
from .turns import set_status

MAX_GOAL_CHARS = 10000


def update_goals(session_id, *, session_goal: str | None = None, phase_goal: str | None = None, by: str = ""):
    """A person (API, Session page) or an admin sets either goal. From the next step on, every
    request shows the new goals (`goals.updated`, an extension event, makes a running slice
    re-read). Returns the Session."""
    with locked_session(session_id) as session:
        changed = {}
        if session_goal is not None and session_goal != session.session_goal:
            changed["session_goal"] = session_goal[:MAX_GOAL_CHARS]
        if phase_goal is not None and phase_goal != session.phase_goal:
            changed["phase_goal"] = phase_goal[:MAX_GOAL_CHARS]
        if changed:
            for name, value in changed.items():
                setattr(session, name, value)
            Session.objects.filter(pk=session.pk).update(**changed, updated_at=timezone.now())
            emit(
                session,
                "goals.updated",
                {"session_goal": session.session_goal, "phase_goal": session.phase_goal, "by": by},
            )
    return session


def apply_understanding(
    session_id,
    token,
    *,
    turn_id: int,
    understanding: dict,
    phase_goal: str | None,
    session_goal: str | None,
    mode: str | None,
) -> Session:
    """Brain's transition, committed: the goals it sets and `task.understood` (CONTRACT data,
    plus `turn_id`, `mode` and the recall terms as extensions)."""
    with locked_session(session_id, token) as session:
        changed = {}
        if phase_goal is not None:
            changed["phase_goal"] = phase_goal
        if session_goal is not None and not session.session_goal:
            changed["session_goal"] = session_goal
        if changed:
            for name, value in changed.items():
                setattr(session, name, value)
            Session.objects.filter(pk=session.pk).update(**changed)
        emit(
            session,
            "task.understood",
            {
                "task_relation": understanding["task_relation"],
                "session_goal": session.session_goal,
                "phase_goal": session.phase_goal,
                "turn_id": turn_id,
                "mode": mode,
                "recall_terms": {k: v for k, v in understanding.items() if k != "task_relation"},
            },
        )
    return session


def report_preparation_failure(session_id, token, *, turn_id: int, code: str, message: str) -> None:
    """A stage of the outer loop failed: an `error` event; the goals, capabilities and the input
    stay as they were, and the turn runs anyway."""
    with locked_session(session_id, token) as session:
        emit(session, "error", {"code": code, "message": message[:1000], "turn_id": turn_id})


def finish_preparation(session_id, token, turn_id: int) -> None:
    """The outer loop is done (or gave up): the turn's steps may begin."""
    with locked_session(session_id, token) as session:
        if session.current_turn_id == turn_id and session.status == SessionStatus.PREPARING:
            set_status(session, SessionStatus.RUNNING)


def add_recalled_memories(session_id, token, *, turn_id: int, memory_ids: list[int]) -> list[int]:
    """Memories orchestration recalled join the turn's (add-only); `memory.recalled` names the
    new ones. Returns them."""
    with locked_session(session_id, token) as session:
        turn = Turn.objects.only("recalled_memory_ids").get(pk=turn_id)
        new = [i for i in memory_ids if i not in turn.recalled_memory_ids]
        if new:
            Turn.objects.filter(pk=turn_id).update(recalled_memory_ids=[*turn.recalled_memory_ids, *new])
            last = session.messages.order_by("-id").values_list("id", flat=True).first()
            emit(
                session, "memory.recalled", {"turn_id": turn_id, "memory_ids": new, "after_message_id": last}
            )
    return new


def begin_preparation_call(
    session_id,
    token,
    *,
    turn_id: int,
    purpose: str,
    model,
    instructions: str,
    payload: dict,
    request_tokens: int,
) -> ModelCall:
    """The evidence row of an outer-loop call, opened before it is sent (a runner lost meanwhile
    leaves it open, and recovery ends it `interrupted`). Its instructions are the system prompt;
    what it was asked (`payload`) is kept in `fact_versions.request`."""
    with locked_session(session_id, token) as session:
        blob = prompt_blob(session.tenant_id, f"{purpose}_prompt", instructions)
        return ModelCall.objects.create(
            tenant_id=session.tenant_id,
            session_id=session.pk,
            turn_id=turn_id,
            purpose=purpose,
            provider=model.provider,
            model=model.model,
            base_url=model.base_url,
            params={"max_tokens": model.max_output_tokens, "stream": False},
            system_prompt_id=blob,
            message_count=2,
            fact_versions={"request": payload},
            estimated_prompt_tokens=request_tokens,
        )


def commit_orchestration(
    session_id,
    token,
    *,
    turn_id: int,
    mode: str,
    candidates: dict,
    chosen: dict,
    skills: list[str],
    refused: list,
) -> dict:
    """What orchestration chose, added in one commit (atomic, add-only: nothing loaded is
    removed; goals, model and identity are not touched), announced by `capabilities.added` (when
    anything was new) and `orchestration.finished` (an extension: the mode, the candidates'
    names, the choice and what was refused, e.g. a Skill that does not fit the budget)."""
    with locked_session(session_id, token) as session:
        added = _add_capabilities(
            session,
            tools=chosen.get("tools", ()),
            toolsets=chosen.get("toolsets", ()),
            skills=skills,
            added_by="orchestrator",
        )
        emit(
            session,
            "orchestration.finished",
            {
                "turn_id": turn_id,
                "mode": mode,
                "candidates": candidates,
                "chosen": chosen,
                "added": added,
                "refused": refused,
            },
        )
    return added


def end_preparation_call(
    session_id, token, call: ModelCall, *, result, answer=None, error: str = "", finish_reason: str = ""
) -> None:
    """Close the row: the result, the validated answer (`fact_versions.answer`) or the error; the
    tokens count toward the Session's usage."""
    usage = (result.usage if result is not None else None) or {}
    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    completion_tokens = int(usage.get("completion_tokens") or 0)
    facts = dict(call.fact_versions)
    if answer is not None:
        facts["answer"] = answer
    elif result is not None and result.text:
        facts["raw_answer"] = result.text[:2000]
    with locked_session(session_id, token):
        ModelCall.objects.filter(pk=call.pk).update(
            finish_reason=finish_reason or (result.finish_reason if result is not None else "error"),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            attempts=result.attempts if result is not None else 1,
            attempt_errors=result.attempt_errors if result is not None else [],
            error=error[:5000],
            fact_versions=facts,
            ended_at=timezone.now(),
        )
        if prompt_tokens or completion_tokens:
            Session.objects.filter(pk=session_id).update(
                prompt_tokens=F("prompt_tokens") + prompt_tokens,
                completion_tokens=F("completion_tokens") + completion_tokens,
            )
