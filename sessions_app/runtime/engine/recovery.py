"""Recovery after a lost runner (ARCHITECTURE §6): what a runner that took over a lapsed or
expired lease finds, normalised in one transaction and announced as `session.recovered`.

The rules, by what the lost runner left:
- a model call without an end is ended `interrupted` (its answer was never committed; the
  next step asks again);
- a turn parked on an approval stays parked: a decision, never recovery, moves it;
- a running turn continues (the tenant's `auto_resume_after_recovery`) or, with auto-continue
  off, ends `interrupted` with the reason; queued inputs stay queued either way;
- a tool call of the turn's last response without a result: one that is read-only or
  idempotent (and was not an approved call) is left unanswered, and the resumed runner runs it
  again through ToolService, approvals included (`AgentService.run_pending_calls`); any other
  gets a committed `interrupted` result, so it never runs twice. Calls after the first one left
  to run again had not started (a call that is not read-only starts only after every earlier
  result is committed), so they run then as they would have; calls after an interrupted one are
  not run, since they may depend on it;
- a compaction left pending is promoted when its summary had been validated, else discarded;
- `running`/`preparing`/`compressing` with no open turn has nothing to resume: `failed`, with an
  `error` event (`recovery_failed`);
- an active goal run is paused first, whatever is found (Brain calls
  `goal_driver.pause_after_recovery` before this): only a person resumes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django.utils import timezone

from approvals_app.choices import ApprovalStatus
from approvals_app.models import PendingApproval
from tenancy_app.models import Tenant

from ...choices import CallPurpose, InputStatus, SessionStatus, TurnReason
from ...models import Input, Message, ModelCall, Session
from ..events import emit
from .compaction import settle_pending_compaction
from .elicitation import cancel_open_requests
from .fencing import locked_session
from .history import INTERRUPTED_CALL_TEXT, record_tool_result, unanswered_calls
from .turns import ACTIVE_STATUSES, end_turn, fail_without_turn

RUNNER_LOST = "the runner was lost during the call (worker stopped); the step is asked again"
LOST_REASON = "runner lost before its result"
NOT_STARTED_TEXT = (
    "Not run: the runner stopped before this call started, after an earlier call of the same "
    "response was interrupted. Decide again whether it is still needed."
)
NOT_STARTED_REASON = "not started: an earlier call of the same response was interrupted"
AUTO_RESUME_OFF = "the runner was lost (worker stopped) and auto-continue after recovery is off"


@dataclass
class Recovery:
    """What a takeover found and did (the `session.recovered` data, for Brain, logs and tests)."""

    restored: list[str] = field(default_factory=list)
    interrupted_calls: list[dict] = field(default_factory=list)
    interrupted_model_calls: list[int] = field(default_factory=list)
    rerun_calls: list[dict] = field(default_factory=list)
    next: str = ""
    found: bool = False
    turn_id: int | None = None  # the turn that was open (the browser places its card there)
    after_message_id: int | None = None  # the last message before the takeover (the card goes after it)

    def as_event(self) -> dict:
        return {
            "restored": self.restored,
            "interrupted_calls": self.interrupted_calls,
            "next": self.next,
            "interrupted_model_calls": self.interrupted_model_calls,
            "rerun_calls": self.rerun_calls,
            **({"turn_id": self.turn_id} if self.turn_id is not None else {}),
            **({"after_message_id": self.after_message_id} if self.after_message_id is not None else {}),
        }


def recover_lost_runner(session_id, token, rerun_kind: Callable[[str], str] | None = None) -> Recovery:
    """Normalise what a lost runner left (see the module docstring). `rerun_kind(tool name)`
    says why a tool may run again ("read-only", "idempotent") or "" (Brain looks it up; without
    it nothing is re-run)."""
    rerun_kind = rerun_kind or (lambda name: "")
    with locked_session(session_id, token) as session:
        # (Brain paused an active goal run before this: it never goes on by itself after a lost
        # runner. The engine does not call up into the driver.)
        # The lost runner's tool call was waiting on these: no server is listening for them now.
        cancel_open_requests(session)
        recovery = Recovery()
        recovery.interrupted_model_calls = _close_open_model_calls(session)
        queued = Input.objects.filter(session_id=session.pk, status=InputStatus.QUEUED).count()
        turn = session.current_turn
        failed = False
        if turn is None:
            if session.status in ACTIVE_STATUSES:
                reason, failed = fail_without_turn(session), True
                recovery.next = f"nothing to resume: {reason}"
            elif queued:
                recovery.next = "the next queued message starts a new turn"
            else:
                recovery.next = "nothing was running"
        else:
            recovery.turn_id = turn.pk
            steps = (
                ModelCall.objects.filter(turn_id=turn.pk, purpose=CallPurpose.AGENT)
                .exclude(finish_reason="interrupted")
                .count()
            )
            recovery.restored.append(f"turn {turn.number} after {steps} step{'s' if steps != 1 else ''}")
            if session.status == SessionStatus.WAITING_APPROVAL:
                _still_waiting(session, recovery)
            elif session.status in ACTIVE_STATUSES:
                auto_resume = (
                    Tenant.objects.filter(pk=session.tenant_id)
                    .values_list("auto_resume_after_recovery", flat=True)
                    .get()
                )
                # A compaction the lost runner left pending is promoted (its summary was
                # validated) or discarded; either way the turn is `running` again.
                settled = settle_pending_compaction(session)
                if settled:
                    recovery.restored.append(settled)
                if auto_resume:
                    _settle_calls(session, turn.pk, rerun_kind, recovery)
                    recovery.next = (
                        f"the calls left run, then the turn continues with step {steps + 1}"
                        if recovery.rerun_calls
                        else "the task is understood again, then the turn begins"
                        if session.status == SessionStatus.PREPARING
                        else f"the turn continues with step {steps + 1}"
                    )
                else:
                    _settle_calls(session, turn.pk, lambda name: "", recovery)
                    end_turn(session, turn, TurnReason.INTERRUPTED, AUTO_RESUME_OFF)
                    recovery.next = "the turn was closed: auto-continue is off" + (
                        "; the next queued message starts a new turn" if queued else ""
                    )
            else:
                recovery.next = f"the turn stays {session.status}"
        if queued:
            recovery.restored.append(f"{queued} queued input{'s' if queued != 1 else ''}")
        recovery.found = bool(turn is not None or recovery.interrupted_model_calls or queued or failed)
        recovery.after_message_id = (
            Message.objects.filter(session_id=session.pk).order_by("-id").values_list("id", flat=True).first()
        )
        if recovery.found:
            emit(session, "session.recovered", recovery.as_event())
        return recovery


def answer_open_calls(session: Session) -> Recovery:
    """A crash is ending the turn (caller holds the Session): a model call it left open is ended
    `interrupted` and every call of the last response without a result gets an `interrupted`
    one (none re-run), so the history the next turn sends stays valid."""
    recovery = Recovery()
    recovery.interrupted_model_calls = _close_open_model_calls(session)
    if session.current_turn_id is not None:
        _settle_calls(session, session.current_turn_id, lambda name: "", recovery)
    return recovery


def _still_waiting(session: Session, recovery: Recovery) -> None:
    approval = (
        PendingApproval.objects.filter(session_id=session.pk, turn_id=session.current_turn_id)
        .order_by("-id")
        .only("id", "tool", "status")
        .first()
    )
    if approval is None:
        recovery.next = "the turn stays waiting for approval"
    elif approval.status == ApprovalStatus.PENDING:
        recovery.restored.append(f"waiting approval #{approval.pk} ({approval.tool})")
        recovery.next = f"waiting for your decision on {approval.tool} (approval #{approval.pk})"
    else:
        recovery.restored.append(f"decided approval #{approval.pk} ({approval.tool}: {approval.status})")
        recovery.next = f"the decision on {approval.tool} (approval #{approval.pk}) is applied next"


def _settle_calls(session: Session, turn_id: int, rerun_kind, recovery: Recovery) -> None:
    """Answer, in model order, the calls that must not run again, up to the first that may;
    that one and the rest stay unanswered for the resumed runner (results stay in model order)."""
    found = unanswered_calls(turn_id)
    if found is None:
        return
    _, calls = found
    approved = set(
        PendingApproval.objects.filter(
            session_id=session.pk, call_id__in=[c.get("id") for c in calls]
        ).values_list("call_id", flat=True)
    )
    # An approved call is never re-run on recovery: its approval was for one execution.
    kinds = ["" if call["id"] in approved else rerun_kind(call["name"]) for call in calls]
    left = next((index for index, kind in enumerate(kinds) if kind), None)
    for index, call in enumerate(calls[: len(calls) if left is None else left]):
        first = index == 0
        record_tool_result(
            session,
            turn_id,
            call_id=call["id"],
            tool=call["name"],
            content=INTERRUPTED_CALL_TEXT if first else NOT_STARTED_TEXT,
            ok=False,
            summary="interrupted" if first else "not started",
        )
        recovery.interrupted_calls.append(
            {
                "call_id": call["id"],
                "tool": call["name"],
                "reason": LOST_REASON if first else NOT_STARTED_REASON,
            }
        )
    if left is None:
        return
    # What may have been dispatched: the first call left and, if it is read-only, the read-only
    # calls that ran beside it (ToolService runs consecutive read-only calls in parallel).
    dispatched = 1
    if kinds[left] == "read-only":
        while left + dispatched < len(calls) and kinds[left + dispatched] == "read-only":
            dispatched += 1
    for index, call in enumerate(calls[left:]):
        if index < dispatched:
            recovery.rerun_calls.append({"call_id": call["id"], "tool": call["name"]})
            recovery.restored.append(f"re-running {kinds[left + index]} call {call['name']} ({call['id']})")
        else:
            recovery.restored.append(
                f"call {call['name']} ({call['id']}) had not started; it runs after them"
            )


def _close_open_model_calls(session: Session) -> list[int]:
    open_calls = list(
        ModelCall.objects.filter(session_id=session.pk, ended_at__isnull=True).values_list("pk", "purpose")
    )
    if open_calls:
        ModelCall.objects.filter(pk__in=[pk for pk, _ in open_calls]).update(
            finish_reason="interrupted", error=RUNNER_LOST, ended_at=timezone.now()
        )
    # Only a step's call was announced (`model.started`); the others' rows say what happened.
    for call_id in [pk for pk, purpose in open_calls if purpose == CallPurpose.AGENT]:
        emit(
            session,
            "model.ended",
            {
                "model_call_id": call_id,
                "finish_reason": "interrupted",
                "usage": {"prompt_tokens": 0, "completion_tokens": 0},
                "error": RUNNER_LOST,
            },
        )
    return [pk for pk, _ in open_calls]
