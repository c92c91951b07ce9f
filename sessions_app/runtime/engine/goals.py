"""Goals and the outer task loop's facts: the session and phase goals (set by task understanding
or by a person, never by what a model writes), the `preparing` phase of a turn, and the
evidence of the outer loop's stateless calls."""

from __future__ import annotations

from django.db.models import F
from django.utils import timezone

from ...choices import SessionStatus
from ...models import ModelCall, Session, Turn
from ...usage import call_params, recorded_usage
from ..events import emit
from .context import prompt_blob
from .fencing import locked_session
from .history import without_nul
from .sessions import _add_capabilities
from .turns import set_status

MAX_GOAL_CHARS = 10000


def update_goals(session_id, *, session_goal: str | None = None, phase_goal: str | None = None, by: str = ""):
    """A person (API, Session page) or an admin sets either goal. From the next step on, every
    request shows the new goals (`goals.updated`, an extension event, makes a running slice
    re-read). Returns the Session."""
    with locked_session(session_id) as session:
        set_goals(session, session_goal=session_goal, phase_goal=phase_goal, by=by)
    return session


def set_goals(
    session: Session, *, session_goal: str | None = None, phase_goal: str | None = None, by: str = ""
):
    """`update_goals` for a caller that holds the Session's lock already (e.g. a goal run started
    by a person: its goal is theirs). None leaves a goal as it is."""
    if _store_goals(session, session_goal=session_goal, phase_goal=phase_goal):
        emit(
            session,
            "goals.updated",
            {"session_goal": session.session_goal, "phase_goal": session.phase_goal, "by": by},
        )


def _store_goals(session: Session, *, session_goal: str | None, phase_goal: str | None) -> bool:
    """Write the goals that change (caller holds the lock; None: unchanged). Surrounding
    whitespace means nothing in a goal; a goal of only spaces is no goal. True when any changed."""
    changed = {}
    for name, value in (("session_goal", session_goal), ("phase_goal", phase_goal)):
        if value is not None and value.strip()[:MAX_GOAL_CHARS] != getattr(session, name):
            changed[name] = value.strip()[:MAX_GOAL_CHARS]
    for name, value in changed.items():
        setattr(session, name, value)
    if changed:
        Session.objects.filter(pk=session.pk).update(**changed, updated_at=timezone.now())
    return bool(changed)


def apply_understanding(
    session_id,
    token,
    *,
    turn_id: int,
    call: ModelCall,
    result,
    understanding: dict,
    phase_goal: str | None,
    session_goal: str | None,
    mode: str | None,
) -> Session:
    """Brain's transition, committed with the task-relation call's evidence: the goals it sets
    and `task.understood` (CONTRACT data, plus `turn_id`, `mode` and the recall terms as
    extensions). Without orchestration to follow (`mode` None) the turn's steps may begin."""
    understanding = without_nul(understanding)  # what a model wrote, stored: no NUL, no lone surrogate
    with locked_session(session_id, token) as session:
        _end_call(session, call, result=result, answer=understanding)
        # The session goal is set once: only while it has none (a person changes it after).
        _store_goals(
            session,
            session_goal=session_goal if not session.session_goal.strip() else None,
            phase_goal=phase_goal,
        )
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
        if mode is None:
            _begin_steps(session, turn_id)
    return session


def preparation_failed(
    session_id, token, *, turn_id: int, call: ModelCall | None, result, error: str, code: str, message: str
) -> None:
    """A stage of the outer loop failed (its call failed or answered wrongly, or recall broke):
    the call's evidence says why, an `error` event tells the user, and the turn's steps begin —
    the goals, capabilities and the input stay as they were."""
    with locked_session(session_id, token) as session:
        if call is not None:
            _end_call(session, call, result=result, error=error)
        emit(session, "error", {"code": code, "message": without_nul(message[:1000]), "turn_id": turn_id})
        _begin_steps(session, turn_id)


def interrupted_preparation(session_id, token, call: ModelCall) -> None:
    """The user interrupted while the call was out: its evidence says so (the queued interrupt
    ends the turn at the next boundary)."""
    with locked_session(session_id, token) as session:
        _end_call(session, call, result=None, error="interrupted by the user", finish_reason="cancelled")


def commit_orchestration(
    session_id,
    token,
    *,
    turn_id: int,
    mode: str,
    call: ModelCall | None,
    result,
    candidates: dict,
    chosen: dict,
    skills: list[str],
    refused: list,
    memory_ids: list[int],
) -> dict:
    """What orchestration chose, in one commit with its call's evidence (`call` None: there was
    nothing to choose from): added atomically and add-only (nothing loaded is removed; goals,
    model and identity are not touched), memories it recalled joined to the turn's; then the
    turn's steps begin. Events: `capabilities.added` (when anything was new), `memory.recalled`
    (new memories) and `orchestration.finished` (an extension: the mode, the candidates' names,
    the choice and what was refused, e.g. a Skill that does not fit the budget)."""
    with locked_session(session_id, token) as session:
        if call is not None:
            _end_call(session, call, result=result, answer=chosen)
        added = _add_capabilities(
            session,
            tools=chosen.get("tools", ()),
            toolsets=chosen.get("toolsets", ()),
            skills=skills,
            added_by="orchestrator",
        )
        _add_memories(session, turn_id, memory_ids)
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
        _begin_steps(session, turn_id)
    return added


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
            params=call_params(model, max_tokens=model.max_output_tokens, stream=False),
            system_prompt_id=blob,
            message_count=2,
            fact_versions={"request": payload},
            estimated_prompt_tokens=request_tokens,
        )


def _begin_steps(session: Session, turn_id: int) -> None:
    """The outer loop is done (or gave up): `running`, and the turn's steps may begin."""
    if session.current_turn_id == turn_id and session.status == SessionStatus.PREPARING:
        set_status(session, SessionStatus.RUNNING)


def _add_memories(session: Session, turn_id: int, memory_ids: list[int]) -> None:
    """Memories orchestration recalled join the turn's (add-only); `memory.recalled` names the new."""
    if not memory_ids:
        return
    turn = Turn.objects.only("recalled_memory_ids").get(pk=turn_id)
    new = [i for i in memory_ids if i not in turn.recalled_memory_ids]
    if new:
        Turn.objects.filter(pk=turn_id).update(recalled_memory_ids=[*turn.recalled_memory_ids, *new])
        last = session.messages.order_by("-id").values_list("id", flat=True).first()
        emit(session, "memory.recalled", {"turn_id": turn_id, "memory_ids": new, "after_message_id": last})


def _end_call(
    session: Session, call: ModelCall, *, result, answer=None, error: str = "", finish_reason: str = ""
):
    """Close an outer-loop call's row (caller holds the lock): the result, the validated answer
    (`fact_versions.answer`) or the raw one, the error; its tokens count toward the usage."""
    usage = recorded_usage(call.params, (result.usage if result is not None else None) or {})
    prompt_tokens, completion_tokens = usage["prompt_tokens"], usage["completion_tokens"]
    facts = dict(call.fact_versions)
    if answer is not None:
        facts["answer"] = answer
    elif result is not None and result.text:
        facts["raw_answer"] = result.text[:2000]
    ended_at = timezone.now()
    latency_ms = max(int((ended_at - call.started_at).total_seconds() * 1000), 0) if call.started_at else None
    # All of it may hold what the model sent: stored without NUL or lone surrogates.
    ModelCall.objects.filter(pk=call.pk).update(
        finish_reason=without_nul(finish_reason or (result.finish_reason if result is not None else "error"))[
            :30
        ],
        **usage,
        attempts=result.attempts if result is not None else 1,
        attempt_errors=without_nul(result.attempt_errors if result is not None else []),
        error=without_nul(error[:5000]),
        fact_versions=without_nul(facts),
        latency_ms=latency_ms,
        ended_at=ended_at,
    )
    if prompt_tokens or completion_tokens:
        Session.objects.filter(pk=session.pk).update(
            prompt_tokens=F("prompt_tokens") + prompt_tokens,
            completion_tokens=F("completion_tokens") + completion_tokens,
        )
