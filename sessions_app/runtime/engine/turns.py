"""Turns and the Session status: a turn starts from a queued message, takes guidance at step
boundaries, and ends with a reason the status follows."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.utils import timezone

from ...choices import CallPurpose, InputKind, QueueReason, Role, SessionKind, SessionStatus, TurnReason
from ...models import Delivery, GoalRun, Input, Message, ModelCall, Session, Turn
from .. import deliveries, memory
from ..events import emit, update_session
from .elicitation import cancel_open_requests
from .fencing import RunnerWriter, locked_session
from .history import append_message, record_tool_result, unanswered_calls
from .rows import insert_row, update_row
from .sessions import TURN_STARTING_KINDS, consume_inputs, queued_inputs, workspace_dir

# Inputs that start a turn when none is open (other kinds wait for their owner). A session event
# (a sub-Session's result) waits, like a message, until the open turn ends.

# Statuses of a turn at work: a Session in one of them with no open turn was left by a lost runner.
ACTIVE_STATUSES = (SessionStatus.RUNNING, SessionStatus.PREPARING, SessionStatus.COMPRESSING)

# How a turn's end reason shows in the Session status users see.
STATUS_AFTER_TURN = {
    TurnReason.COMPLETED: SessionStatus.IDLE,
    TurnReason.BLOCKED: SessionStatus.IDLE,
    TurnReason.MAX_TOKENS: SessionStatus.IDLE,
    TurnReason.ABORTED: SessionStatus.INTERRUPTED,
    TurnReason.INTERRUPTED: SessionStatus.INTERRUPTED,
    TurnReason.ERROR: SessionStatus.FAILED,
}


def set_status(session: Session, status: str, reason: str = "") -> None:
    """Commit a runtime status change (caller holds the lock) and announce it."""
    if session.status == status and session.status_reason == reason:
        return
    session.status = status
    session.status_reason = reason[:500]
    update_session(session, status=status, status_reason=session.status_reason, updated_at=timezone.now())
    emit(session, "session.status", {"status": status, **({"reason": reason} if reason else {})})


# A Session in one of these may wait as `queued`; one preparing, compressing or waiting for a
# person keeps that status (it says more), and is simply woken again later.
QUEUEABLE_STATUSES = (
    SessionStatus.IDLE,
    SessionStatus.RUNNING,
    SessionStatus.PREPARING,  # leaving the queue, it prepares again if it had not (`leave_queue`)
    SessionStatus.INTERRUPTED,
    SessionStatus.FAILED,
    SessionStatus.QUEUED,
)


def queue_for_runner(session_id, reason: str) -> bool:
    """The Session has work but no runner may take it now (`reason`: a QueueReason): it shows
    `queued` with the reason (a `session.status` event) until a runner takes it."""
    with locked_session(session_id) as session:
        if session.status not in QUEUEABLE_STATUSES or session.runner_token is not None:
            return False
        set_status(session, SessionStatus.QUEUED, reason)
        return True


def park_for_quota(session_id, spent: dict) -> bool:
    """A spent quota stops the Session before its next model call (its runner released the lease
    first): `queued` with reason `quota_exceeded` and a `quota.exceeded` event (`spent`: what
    names the limit), once per parking. Its open turn and queued inputs stay as they are."""
    with locked_session(session_id) as session:
        if session.runner_token is not None or session.status not in QUEUEABLE_STATUSES:
            return False
        if session.status == SessionStatus.QUEUED and session.status_reason == QueueReason.QUOTA_EXCEEDED:
            return False
        set_status(session, SessionStatus.QUEUED, QueueReason.QUOTA_EXCEEDED)
        emit(session, "quota.exceeded", spent)
        return True


def leave_queue(session_id, token) -> None:
    """A runner took a `queued` Session: back to what it was doing (an open turn runs on; one the
    outer loop has not prepared yet is prepared first)."""
    with locked_session(session_id, token) as session:
        if session.status == SessionStatus.QUEUED:
            if session.current_turn_id is None:
                set_status(session, SessionStatus.IDLE)
            elif _still_to_prepare(session):
                set_status(session, SessionStatus.PREPARING, "understanding the task")
            else:
                set_status(session, SessionStatus.RUNNING)


def _still_to_prepare(session: Session) -> bool:
    """The open turn needs the outer loop's task understanding and has not had it: no
    `task_relation` call was made for it (one that failed also moved the turn on)."""
    started_by = Input.objects.filter(turn_id=session.current_turn_id).order_by("id").first()
    return (
        started_by is not None
        and needs_understanding(session, started_by)
        and not ModelCall.objects.filter(
            turn_id=session.current_turn_id, purpose=CallPurpose.TASK_RELATION
        ).exists()
    )


def fail_without_turn(session: Session) -> str:
    """A status that says a turn is at work with no turn open (only a lost runner leaves that):
    nothing can be resumed, so the Session is `failed`, with the reason and an `error` event.
    Caller holds the lock. Returns the reason."""
    reason = f"recovery failed: the status was {session.status} but no turn was open to resume"
    set_status(session, SessionStatus.FAILED, reason)
    emit(session, "error", {"code": "recovery_failed", "message": reason})
    return reason


def start_turn(session_id, token, input: Input) -> Turn:
    """Begin a turn for a message input: consume it, commit it as the user message, status running
    (or preparing, when the outer loop understands the task first). The Turn returned carries
    that status as `session_status` and its input as `started_by`: what the runner would
    otherwise read back before the first step (`SliceContext.refresh`)."""
    with locked_session(session_id, token) as session:
        return _begin_turn(session, input)


def _begin_turn(session: Session, input: Input) -> Turn:
    """`start_turn`, the caller holding the lock."""
    number = (
        Turn.objects.filter(session=session).order_by("-number").values_list("number", flat=True).first() or 0
    ) + 1
    turn = Turn.objects.create(tenant_id=session.tenant_id, session=session, number=number)
    consume_inputs([input], turn)
    request = append_message(session, turn.pk, Role.USER, input_text(input), input=input)
    understands = needs_understanding(session, input)
    if not understands and not session.phase_goal and input.kind == InputKind.MESSAGE:
        # A MainSession skips task understanding: its first task sets the goals.
        session.phase_goal = str(input.payload.get("text", ""))[:2000]
        if not session.session_goal:
            session.session_goal = session.phase_goal
        update_session(session, phase_goal=session.phase_goal, session_goal=session.session_goal)
    session.current_turn = turn
    update_session(session, current_turn=turn)
    emit(session, "turn.started", {"turn_id": turn.pk})
    user_id = memory_user_id(session, [input.created_by_id])
    if input.kind == InputKind.MESSAGE and user_id is not None:
        _recall_memories(session, turn, request, user_id)
    if understands:
        # The outer loop (Brain) understands the task before the first step.
        set_status(session, SessionStatus.PREPARING, "understanding the task")
    else:
        set_status(session, SessionStatus.RUNNING)
    turn.session_status, turn.started_by = session.status, input
    return turn


def needs_understanding(session: Session, input: Input) -> bool:
    """Whether a turn starts with the outer loop's task understanding (ARCHITECTURE §2): in a
    sub-Session, for a message with text. A MainSession coordinates and skips it, as do guidance,
    system notices (session events), approval decisions, attachment-only inputs and the later
    rounds of a goal run (the product's own continuation of a task already understood)."""
    payload = input.payload or {}
    return (
        session.kind == SessionKind.SUB
        and input.kind == InputKind.MESSAGE
        and bool(str(payload.get("text", "")).strip())
        and not (payload.get("goal_run_id") and int(payload.get("round") or 1) > 1)
    )


def memory_user_id(session: Session, author_ids) -> int | None:
    """Whose long-term memory a turn uses: the Session owner's, when only the owner (or the
    product, with no author) wrote into it. Memory is personal: a turn someone else started or
    joined (guidance) neither recalls nor writes anyone's memory, so nobody reads or plants
    another's memories through the agent."""
    if session.owner_id is None or any(author not in (None, session.owner_id) for author in author_ids):
        return None
    return session.owner_id


def turn_author_ids(turn_id: int) -> set[int | None]:
    """Who wrote the messages and guidance of a turn (None: no person, e.g. a Session event)."""
    return set(
        Input.objects.filter(turn_id=turn_id, kind__in=TURN_STARTING_KINDS).values_list(
            "created_by_id", flat=True
        )
    )


def _recall_memories(session: Session, turn: Turn, request: Message, user_id: int) -> None:
    """Task setup: the user's memories that fit the request are kept on the turn; every request
    of the turn shows them (`memory.recalled` says which, an extension event)."""
    ids = memory.recall_for_task(tenant_id=session.tenant_id, user_id=user_id, request_text=request.content)
    if ids:
        turn.recalled_memory_ids = ids
        Turn.objects.filter(pk=turn.pk).update(recalled_memory_ids=ids)
        emit(
            session,
            "memory.recalled",
            {"turn_id": turn.pk, "memory_ids": ids, "after_message_id": request.pk},
        )


def input_text(input: Input) -> str:
    text = str(input.payload.get("text", ""))
    attachments = input.payload.get("attachments") or []
    if attachments:
        text += "\n\nAttached files in the workspace: " + ", ".join(attachments)
    return text


def end_turn(session: Session, turn: Turn, reason: str, detail: str = "", *, also_save=()) -> bool:
    """Close a turn (caller holds the lock); the Session status follows the reason. `also_save`:
    other fields of `turn` the caller changed, written in the same UPDATE.

    The engine only records facts: when the end moves something above it — the report a
    delegating MainSession waits for, a goal run's next round — the turn is marked
    `followups_pending` in the same commit and Brain applies them (runtime/followups.py).
    Returns whether it did."""
    if turn.ended_at is not None:
        return False
    turn.reason, turn.reason_detail, turn.ended_at = reason, detail[:1000], timezone.now()
    turn.followups_pending = (
        session.parent_id is not None
        or GoalRun.objects.filter(session_id=session.pk, status__in=GoalRun.OPEN_STATUSES).exists()
    )
    written = ("reason", "reason_detail", "ended_at", "followups_pending", *also_save)
    update_row(Turn, turn.pk, **{name: getattr(turn, name) for name in written})
    session.current_turn = None
    update_session(session, current_turn=None)
    emit(
        session,
        "turn.ended",
        {"turn_id": turn.pk, "reason": reason, **({"detail": detail} if detail else {})},
    )
    set_status(session, STATUS_AFTER_TURN[reason], detail if reason != TurnReason.COMPLETED else "")
    return turn.followups_pending


def fail_turn(session: Session, turn: Turn, *, code: str, reason: str) -> None:
    """End a turn the runtime had to stop (caller holds the lock): an `error` event with `code`,
    then the turn ends `error` and the Session becomes `failed`, both with `reason`."""
    if turn.ended_at is not None:
        return
    emit(session, "error", {"code": code, "message": reason})
    end_turn(session, turn, TurnReason.ERROR, reason)


def finish_turn(
    session_id,
    token,
    turn_id: int,
    reason: str,
    detail: str = "",
    *,
    progress: TurnProgress | None = None,
    redactor=None,
    turn: Turn | None = None,
) -> bool:
    """End the runner's turn (with its last step count and loop-guard memory). A `completed`
    turn gets its delivery record in the same commit, announced before `turn.ended` so a client
    that stops at the turn's end has seen it; `redactor`: the slice's, if it has one (else the
    tenant's secrets are read); `turn`: the slice's copy of the turn (its tenant, Session and
    start), else it is read. Returns whether the end has follow-ups for Brain to apply
    (`end_turn`); True, to be safe, when the turn had already ended."""
    facts = None
    if reason == TurnReason.COMPLETED:
        turn = turn if turn is not None and turn.pk == turn_id else Turn.objects.get(pk=turn_id)
        # Reading and parsing the files happens before the lock is taken (a turn that ended
        # meanwhile wastes the reading, nothing else: it is looked at under the lock).
        facts = deliveries.gather(turn, workspace_dir(turn.tenant_id, session_id), redactor)
    with locked_session(session_id, token) as session:
        # Only `end_turn` ends a turn, and it clears the Session's current turn in the same commit.
        if session.current_turn_id != turn_id:
            return True
        ending = Turn(pk=turn_id, tenant_id=session.tenant_id, session_id=session.pk)
        if facts is not None:
            _record_delivery(session, ending, facts)
        progressed = ["steps", "guard_state"] if progress is not None else []
        if progress is not None:
            ending.steps, ending.guard_state = progress.steps, progress.guard_state
        return end_turn(session, ending, reason, detail, also_save=progressed)


@dataclass
class TurnProgress:
    """A turn's step count and loop-guard memory. A runner slice keeps them in memory and
    writes them when the slice or the turn ends (a lost runner loses at most one slice of
    them, never a step of history)."""

    steps: int = 0
    guard_state: dict = field(default_factory=dict)


def save_progress(writer: RunnerWriter, turn_id: int, progress: TurnProgress) -> None:
    with writer.commit():
        Turn.objects.filter(pk=turn_id, ended_at__isnull=True).update(
            steps=progress.steps, guard_state=progress.guard_state
        )


def _record_delivery(session: Session, turn: Turn, facts: deliveries.DeliveryFacts) -> Delivery:
    delivery = insert_row(
        Delivery(
            tenant_id=session.tenant_id,
            session=session,
            turn=turn,
            final_answer=facts.final_answer,
            files=facts.files,
            checks=facts.checks,
            unresolved_failures=facts.unresolved_failures,
            decisions=facts.decisions,
        )
    )
    emit(
        session,
        "delivery.recorded",
        {
            "delivery_id": delivery.pk,
            "turn_id": turn.pk,
            "checks_ok": delivery.checks_ok,
            "unresolved": len(facts.unresolved_failures),
            "outcome": delivery.outcome,
        },
    )
    return delivery


@dataclass
class Boundary:
    """What a runner finds at a step boundary: one locked look at the Session and its queue."""

    consumed: int = 0  # inputs consumed here (interrupts or guidance)
    interrupted: bool = False  # interrupts were applied: the open turn (if any) ended `aborted`
    turn_id: int | None = None  # the open turn
    status: str = ""
    next_input: Input | None = None  # no turn is open: the message that starts the next one
    started: Turn | None = None  # `start_next`: the turn `next_input` began (as `start_turn`)


def take_boundary(session_id, token, on_parked=None, *, start_next: bool = False) -> Boundary:
    """At a step boundary, in one transaction holding the Session: clear the wake flag and read
    the queue once (an input committed later either flags the next step's opening commit or is
    seen when the runner releases). Interrupts end the open turn `aborted` — `on_parked(session)`
    first closes what a parked turn waits on (a pending approval); guidance joins the running
    turn as user messages stored as the person wrote them (the request frames them).
    `start_next`: when no turn is open, the next message starts one in the same transaction
    (what `start_turn` does, without a second lock of the row)."""
    with locked_session(session_id, token) as session:
        if session.wake_requested:
            Session.objects.filter(pk=session.pk).update(wake_requested=False)
        queued = list(queued_inputs(session.pk, [InputKind.INTERRUPT, *TURN_STARTING_KINDS]))
        interrupts = [i for i in queued if i.kind == InputKind.INTERRUPT]
        if interrupts:
            turn = session.current_turn
            consume_inputs(interrupts, turn)
            # A question a server asked during the turn is moot now (its waiting call normally
            # cancelled it already; this covers a call that is gone).
            cancel_open_requests(session)
            if (
                turn is not None
                and session.status == SessionStatus.WAITING_APPROVAL
                and on_parked is not None
            ):
                on_parked(session)
            if turn is not None and turn.ended_at is None:
                _answer_unanswered(session, turn.pk, "Not run: the user interrupted the turn.")
                end_turn(session, turn, TurnReason.ABORTED, "interrupted by the user")
            return Boundary(consumed=len(interrupts), interrupted=True)
        if session.current_turn_id is None and session.status in ACTIVE_STATUSES:
            fail_without_turn(session)
        boundary = Boundary(turn_id=session.current_turn_id, status=session.status)
        if session.current_turn_id is None:
            boundary.next_input = next((i for i in queued if i.kind in TURN_STARTING_KINDS), None)
            if start_next and boundary.next_input is not None:
                boundary.started = _begin_turn(session, boundary.next_input)
        elif session.status in ACTIVE_STATUSES:
            guidance = [i for i in queued if i.kind == InputKind.GUIDANCE]
            # Guidance waits while calls left by recovery are still to run: a user message must
            # not come between a response's tool calls and their results.
            if guidance and unanswered_calls(session.current_turn_id) is not None:
                guidance = []
            if guidance:
                consume_inputs(guidance, Turn(pk=session.current_turn_id))
                for item in guidance:
                    append_message(session, session.current_turn_id, Role.USER, input_text(item), input=item)
            boundary.consumed = len(guidance)
        return boundary


def _answer_unanswered(session: Session, turn_id: int, text: str) -> None:
    """Give every call still unanswered in the turn's last response a result (`text`), so the
    history stays valid for later requests. Only calls recovery left to run can be unanswered
    here (a running step answers its own calls, even when interrupted)."""
    found = unanswered_calls(turn_id)
    for call in found[1] if found else ():
        record_tool_result(
            session, turn_id, call_id=call["id"], tool=call["name"], content=text, ok=False, summary="not run"
        )
