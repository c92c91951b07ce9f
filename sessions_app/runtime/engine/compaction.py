"""Compaction: SessionEngine's half of context compression (ARCHITECTURE §5).

When a request would exceed the model's budget, the runner (AgentService) asks for a plan
from its frozen request history (`plan_compaction`: a legal boundary), and SessionEngine
writes each phase as one locked, fenced transaction:

  begin   — a *pending* Checkpoint naming the boundary, status `compressing`,
            `compaction.started`, and the summary call's evidence row;
  record  — the summary call's result and, when SummaryService validated it, the state;
  commit  — the checkpoint committed, the Session's context start advanced to the boundary,
            status back to `running`, `compaction.committed`.
A failed or invalid summary turns the pending checkpoint into a deterministic trim at the same
boundary (`fall_back_to_trim`), and `compaction.committed` says so. An interrupt discards it
(`compaction.discarded`). A runner lost in between leaves a pending checkpoint that recovery
promotes (validated) or discards (`settle_pending_compaction`). Raw history is never deleted; goals stay the Session's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.utils import timezone

from ...choices import CallPurpose, Role, SessionStatus
from ...models import Checkpoint, Message, ModelCall, Session
from ...usage import call_params, recorded_usage
from ..events import emit
from ..llm.config import EffectiveModel
from .fencing import locked_session
from .history import RequestHistory, turn_request, without_nul
from .turns import set_status

# After a compaction the kept history should use at most this share of the budget, so the
# next compaction is many steps away; the continuity state at most STATE_SHARE.
KEEP_RECENT_SHARE = 0.4
STATE_SHARE = 0.2
# How many of the compacted calls a deterministic trim lists by name.
TRIM_LISTED_CALLS = 30


def state_budget(budget: int) -> int:
    """The most tokens a continuity state may take (what a summary is validated against)."""
    return max(int(budget * STATE_SHARE), 64)


@dataclass
class CompactionPlan:
    start_index: int  # the history position of the first message kept
    start_id: int
    covers_from_id: int
    covers_to_id: int
    span: list[dict]  # the wire messages being compacted
    tokens_before: int


def plan_compaction(history: RequestHistory, *, budget: int, fixed_tokens: int) -> CompactionPlan | None:
    """Where to cut the frozen history: the earliest legal boundary after which the kept
    messages fit KEEP_RECENT_SHARE of the budget — and at least the last step is kept.

    Legal: the first kept message is never a tool result (its call would be cut off from it),
    so every assistant tool call keeps all its results. None: nothing can be cut.
    `fixed_tokens`: what the request holds besides history (system prompt, tools, anchor)."""
    ids, roles, tokens = history.ids, history.roles, history.tokens
    legal = [i for i in range(1, len(ids)) if roles[i] != Role.TOOL]
    if not legal:
        return None
    keep_target = max(int(budget * KEEP_RECENT_SHARE) - fixed_tokens, 0)
    suffix = 0
    kept_from = len(ids)
    for index in range(len(ids) - 1, 0, -1):
        suffix += tokens[index]
        if suffix > keep_target:
            break
        kept_from = index
    start = next((i for i in legal if i >= kept_from), legal[-1])
    return CompactionPlan(
        start_index=start,
        start_id=ids[start],
        covers_from_id=ids[0],
        covers_to_id=ids[start - 1],
        span=history.wire_span(0, start),
        tokens_before=sum(tokens) + fixed_tokens,
    )


def begin_compaction(
    session_id,
    token,
    *,
    turn_id: int | None,
    plan: CompactionPlan,
    budget: int,
    model: EffectiveModel,
    system_prompt_blob_id: int,
    request_tokens: int,
) -> tuple[Checkpoint, ModelCall]:
    """Phase one: the pending checkpoint, status `compressing`, `compaction.started`, and the
    summary call's evidence row (a `summary` ModelCall) — one transaction. The checkpoint names
    the turn's user request as its anchor when the cut passes it (it is then sent after the
    continuity state)."""
    with locked_session(session_id, token) as session:
        anchor = turn_request(turn_id)
        # The anchor is re-sent only when the cut passes it; otherwise it is kept verbatim anyway.
        anchor_id = anchor.pk if anchor is not None and anchor.pk < plan.start_id else None
        _settle(session, "a newer compaction started")  # a leftover of a lost runner
        checkpoint = Checkpoint.objects.create(
            tenant_id=session.tenant_id,
            session=session,
            turn_id=turn_id,
            start_message_id=plan.start_id,
            covers_from_id=plan.covers_from_id,
            covers_to_id=plan.covers_to_id,
            anchor_message_id=anchor_id,
            tokens_before=plan.tokens_before,
            budget=budget,
        )
        call = ModelCall.objects.create(
            tenant_id=session.tenant_id,
            session_id=session.pk,
            turn_id=turn_id,
            purpose=CallPurpose.SUMMARY,
            provider=model.provider,
            model=model.model,
            base_url=model.base_url,
            params=call_params(model, max_tokens=model.max_output_tokens),
            system_prompt_id=system_prompt_blob_id,
            first_message_id=plan.covers_from_id,
            last_message_id=plan.covers_to_id,
            message_count=len(plan.span),
            fact_versions={"checkpoint_id": checkpoint.pk, "budget": budget},
            estimated_prompt_tokens=request_tokens,
        )
        Checkpoint.objects.filter(pk=checkpoint.pk).update(summary_call=call)
        checkpoint.summary_call = call
        set_status(session, SessionStatus.COMPRESSING, f"compacting {len(plan.span)} earlier messages")
        emit(
            session,
            "compaction.started",
            {
                "checkpoint_id": checkpoint.pk,
                "turn_id": turn_id,
                "messages": len(plan.span),
                "tokens_before": plan.tokens_before,
            },
        )
    return checkpoint, call


def record_summary(
    session_id, token, checkpoint: Checkpoint, *, result, state: dict | None, error: str = ""
) -> None:
    """Phase two: the summary call's evidence, and the validated state on the pending checkpoint
    (from here on, a lost runner's compaction is promoted by recovery rather than discarded)."""
    usage = (result.usage if result is not None else None) or {}
    with locked_session(session_id, token):
        calls = ModelCall.objects.filter(pk=checkpoint.summary_call_id)
        params = calls.values_list("params", flat=True).first()
        calls.update(
            finish_reason=result.finish_reason if result is not None else "error",
            **recorded_usage(params, usage),
            attempts=result.attempts if result is not None else 1,
            attempt_errors=without_nul(result.attempt_errors if result is not None else []),
            error=without_nul(error[:5000]),
            ended_at=timezone.now(),
        )
        if state is not None:
            state = without_nul(state)  # the model's text, stored: no NUL, no lone surrogate
            Checkpoint.objects.filter(pk=checkpoint.pk, status=Checkpoint.Status.PENDING).update(state=state)
            checkpoint.state = state


def commit_compaction(session_id, token, checkpoint: Checkpoint, *, tokens_after: int) -> None:
    """Phase three: the checkpoint committed and the context start advanced, in one commit."""
    with locked_session(session_id, token) as session:
        checkpoint.tokens_after = tokens_after
        _commit(session, checkpoint)


def fall_back_to_trim(
    session_id, token, checkpoint: Checkpoint, *, reason: str, previous_state: dict | None, tokens_after: int
) -> Checkpoint:
    """The summary failed or was invalid: the pending checkpoint becomes a deterministic trim at
    the same boundary, its state built from facts the product holds, and commits — so
    `compaction.committed` closes the `compaction.started` of the same id, saying `method: trim`
    and why (the failed summary call stays in the evidence)."""
    with locked_session(session_id, token) as session:
        checkpoint.method = Checkpoint.Method.TRIM
        checkpoint.state = trim_state(session, checkpoint, previous_state, reason)
        checkpoint.reason = reason[:500]
        checkpoint.tokens_after = tokens_after
        Checkpoint.objects.filter(pk=checkpoint.pk, status=Checkpoint.Status.PENDING).update(
            method=checkpoint.method, state=checkpoint.state, reason=checkpoint.reason
        )
        _commit(session, checkpoint)
    return checkpoint


def abandon_compaction(session_id, token, checkpoint: Checkpoint, *, reason: str) -> None:
    """The compaction was interrupted (or crashed): discard it, change nothing else. The status
    stays `compressing` until the interrupt is applied at the next boundary (or the crash ends
    the turn), so it never shows `running` for a turn that is stopping."""
    with locked_session(session_id, token) as session:
        _discard(session, checkpoint, reason)
        ModelCall.objects.filter(pk=checkpoint.summary_call_id, ended_at__isnull=True).update(
            finish_reason="cancelled", error=reason, ended_at=timezone.now()
        )


def settle_pending_compaction(session: Session) -> str | None:
    """Recovery (caller holds the Session): a pending compaction left by a lost runner is
    promoted when its summary was validated, else discarded. Returns what was done, for
    `session.recovered`, or None when there was nothing pending."""
    return _settle(session, "the runner was lost before its summary was validated")


def _settle(session: Session, reason: str) -> str | None:
    pending = Checkpoint.objects.filter(session_id=session.pk, status=Checkpoint.Status.PENDING).first()
    if pending is None:
        if session.status == SessionStatus.COMPRESSING:
            set_status(session, SessionStatus.RUNNING)
            return "the compaction in progress was stopped; it is redone when the budget needs it"
        return None
    if pending.validated:
        _commit(session, pending)
        return f"compaction {pending.pk} promoted (its summary had been validated)"
    _discard(session, pending, reason)
    if session.status == SessionStatus.COMPRESSING:
        set_status(session, SessionStatus.RUNNING)
    return f"compaction {pending.pk} discarded ({reason}); it is redone when the budget needs it"


def _commit(session: Session, checkpoint: Checkpoint) -> None:
    now = timezone.now()
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        status=Checkpoint.Status.COMMITTED, ended_at=now, tokens_after=checkpoint.tokens_after
    )
    Session.objects.filter(pk=session.pk).update(
        context_start_message_id=checkpoint.start_message_id, context_checkpoint_id=checkpoint.pk
    )
    session.context_start_message_id = checkpoint.start_message_id
    session.context_checkpoint_id = checkpoint.pk
    if session.status == SessionStatus.COMPRESSING:
        set_status(session, SessionStatus.RUNNING)
    emit(
        session,
        "compaction.committed",
        {
            "checkpoint_id": checkpoint.pk,
            "turn_id": checkpoint.turn_id,
            "method": checkpoint.method,
            "covers_to_id": checkpoint.covers_to_id,
            "tokens_before": checkpoint.tokens_before,
            "tokens_after": checkpoint.tokens_after,
            **({"reason": checkpoint.reason} if checkpoint.reason else {}),
        },
    )


def _discard(session: Session, checkpoint: Checkpoint, reason: str) -> None:
    """A compaction that will not commit: the checkpoint is kept as `discarded` with the reason,
    and `compaction.discarded` (an extension of CONTRACT's events) closes its `compaction.started`."""
    discarded = Checkpoint.objects.filter(pk=checkpoint.pk, status=Checkpoint.Status.PENDING).update(
        status=Checkpoint.Status.DISCARDED, reason=reason[:500], ended_at=timezone.now()
    )
    if discarded:
        emit(
            session,
            "compaction.discarded",
            {"checkpoint_id": checkpoint.pk, "turn_id": checkpoint.turn_id, "reason": reason[:500]},
        )


def trim_state(session: Session, checkpoint: Checkpoint, previous_state: dict | None, reason: str) -> dict:
    """A continuity state without a model: the previous state carried over, the calls made in
    the trimmed messages by name, and the active request in the user's words."""
    previous = previous_state or {}
    rows = Message.objects.filter(
        session_id=session.pk, id__gte=checkpoint.covers_from_id, id__lte=checkpoint.covers_to_id
    ).values_list("role", "tool_calls")
    calls = []
    for role, tool_calls in rows:
        if role == Role.ASSISTANT:
            calls += [f"{c.get('name')}({str(c.get('arguments'))[:120]})" for c in tool_calls or []]
    trimmed = len(rows)
    anchor = turn_request(checkpoint.turn_id)
    return {
        "goal": previous.get("goal") or session.phase_goal or session.session_goal,
        "deliverables": _as_list(previous.get("deliverables")),
        "progress": _as_list(previous.get("progress"))
        + [
            f"{trimmed} earlier messages were removed from the context without a summary ({reason}).",
            *([f"Calls made in them: {'; '.join(calls[-TRIM_LISTED_CALLS:])}"] if calls else []),
        ],
        "decisions": _as_list(previous.get("decisions")),
        "constraints": _as_list(previous.get("constraints")),
        "open_questions": _as_list(previous.get("open_questions")),
        "next_actions": _as_list(previous.get("next_actions"))
        or ["Re-read files you need (their contents were in the removed messages) and continue."],
        "artifacts": _as_list(previous.get("artifacts")),
        "active_user_request": (anchor.content[:2000] if anchor else previous.get("active_user_request", "")),
    }


def _as_list(value) -> list[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else list(value)


def continuity_text(state: dict | None) -> str:
    """How a committed checkpoint's state enters the system prompt."""
    if not state:
        return ""
    return (
        "Continuity state of your earlier work in this Session (the messages before this point "
        "were compacted; the goals above, not this state, are authoritative):\n"
        + json.dumps(state, ensure_ascii=False)
    )
