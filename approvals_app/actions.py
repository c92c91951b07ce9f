"""Owner operations for PendingApproval (STYLE §2): the only code that writes its rows.

Each `do_*` writes the row, its audit (the decision fields on the row and a log line) and, where
a person can see the change, its event. Callers that emit an event hold the Session row lock
(`engine.locked_session`), so the event gets the Session's next `seq` in the same transaction.
Every status change is a compare-and-set on `pending`: two simultaneous decisions have one
winner, and an approved call is claimed for execution exactly once.

What the decision does to the Session (an `approval_decision` input, the wake-up, the
`waiting_approval`/`running` status) is the runtime's, one layer up (`brain.submit_decision`,
`sessions_app.runtime.approvals`); only `events.emit`, the low-level event writer, is used here.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.utils import timezone

from sessions_app.runtime.events import emit
from tenancy_app import audit

from .choices import ApprovalStatus
from .models import PendingApproval

logger = logging.getLogger(__name__)

# What a person sends (REST body, WebSocket frame) -> the status it leads to.
DECISIONS = {"approve": ApprovalStatus.APPROVED, "reject": ApprovalStatus.REJECTED}
# The statuses `do_decide` may set; `cancelled` is `do_cancel`'s (an interrupt, not a decision).
DECIDED = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED)


class AlreadyDecided(Exception):
    def __init__(self, approval: PendingApproval):
        super().__init__(f"approval {approval.pk} is already {approval.status}")
        self.approval = approval


def do_request_approval(
    session,
    *,
    turn_id: int,
    assistant_message_id: int,
    call_id: str,
    tool: str,
    tool_source: str,
    risk: str,
    arguments: dict,
    arguments_redacted: dict,
    verdict,
    remaining_call_ids: list[str],
) -> PendingApproval:
    """Park one tool call for a person: the RuntimeAuditUnit row + `approval.requested`.

    `session` is the row locked by the caller; `verdict` the policy's (approvals_app.policy.Verdict)."""
    expires_at = None
    if verdict.expires_after_hours:
        expires_at = timezone.now() + timedelta(hours=verdict.expires_after_hours)
    approval = PendingApproval.objects.create(
        tenant_id=session.tenant_id,
        session_id=session.pk,
        turn_id=turn_id,
        assistant_message_id=assistant_message_id,
        call_id=call_id,
        tool=tool,
        tool_source=tool_source,
        arguments=arguments,
        arguments_redacted=arguments_redacted,
        risk=risk,
        reason=verdict.reason[:500],
        rule=verdict.rule or {},
        remaining_call_ids=remaining_call_ids,
        deciders=verdict.deciders or {},
        requested_by_id=session.owner_id,
        expires_at=expires_at,
    )
    logger.info(
        "approval %s requested: session %s, call %s, tool %s (%s)",
        approval.pk,
        session.pk,
        call_id,
        tool,
        risk,
    )
    emit(
        session,
        "approval.requested",
        {
            "approval_id": approval.pk,
            "call_id": call_id,
            "tool": tool,
            "risk": approval.risk,
            "reason": approval.reason,
        },
    )
    return approval


def _close(approval: PendingApproval, status: str, *, user=None, comment: str = "") -> PendingApproval:
    """pending -> `status`, once (compare-and-set). Raises AlreadyDecided for the loser."""
    won = PendingApproval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
        status=status,
        decided_by=user if getattr(user, "is_authenticated", False) else None,
        decided_at=timezone.now(),
        comment=comment[:5000],
    )
    approval.refresh_from_db()
    if not won:
        raise AlreadyDecided(approval)
    return approval


def do_decide(
    session, approval: PendingApproval, status: str, *, user=None, comment: str = ""
) -> PendingApproval:
    """pending -> approved/rejected/expired + `approval.decided`; the caller holds `session`'s lock.

    Used for every decision (REST, WebSocket, expiry) through `brain.submit_decision`.
    Raises AlreadyDecided if it was decided (or cancelled) before, ValueError for another status."""
    if status not in DECIDED:
        raise ValueError(f"an approval cannot be decided {status!r}")
    _close(approval, status, user=user, comment=comment)
    by = user.get_username() if getattr(user, "is_authenticated", False) else "system"
    audit.record(
        f"approval.{status}",
        tenant_id=approval.tenant_id,
        obj=approval,
        # Named here too: a decision over the WebSocket serves no HTTP request.
        user=user if getattr(user, "is_authenticated", False) else None,
        changes={
            "tool": {"after": approval.tool},
            **({"comment": {"after": comment[:500]}} if comment else {}),
        },
    )
    logger.info("approval %s %s by %s", approval.pk, status, by)
    emit(session, "approval.decided", {"approval_id": approval.pk, "decision": str(status), "by": by})
    return approval


def do_cancel(session, approval: PendingApproval, *, comment: str = "the user interrupted the turn") -> bool:
    """pending -> cancelled + `approval.decided` (by "interrupt"): the turn it parked was interrupted.

    False, and nothing written, when a decision got there first; the caller holds `session`'s lock."""
    try:
        _close(approval, ApprovalStatus.CANCELLED, comment=comment)
    except AlreadyDecided:
        return False
    logger.info("approval %s cancelled: %s", approval.pk, comment)
    emit(
        session,
        "approval.decided",
        {"approval_id": approval.pk, "decision": str(ApprovalStatus.CANCELLED), "by": "interrupt"},
    )
    return True


def do_claim_execution(approval: PendingApproval) -> bool:
    """True for exactly one caller: the one that may run the approved call."""
    claimed = bool(
        PendingApproval.objects.filter(
            pk=approval.pk, status=ApprovalStatus.APPROVED, executed_at__isnull=True
        ).update(executed_at=timezone.now())
    )
    if claimed:
        logger.info(
            "approval %s: the approved call %s is claimed for execution", approval.pk, approval.call_id
        )
    return claimed


def do_record_execution(approval: PendingApproval, summary: str) -> None:
    """The (redacted) summary of what the approved call did, for auditors."""
    PendingApproval.objects.filter(pk=approval.pk).update(execution_result=summary[:2000])
    logger.info("approval %s: call %s ran: %s", approval.pk, approval.call_id, summary[:200])


def do_mark_handled(approval: PendingApproval) -> bool:
    """A rejected, expired or cancelled approval is handled once its call has a result: it is
    never taken up again. False if it was already handled (or claimed for execution)."""
    handled = bool(
        PendingApproval.objects.filter(pk=approval.pk, executed_at__isnull=True).update(
            executed_at=timezone.now()
        )
    )
    if handled:
        logger.info("approval %s (%s) handled", approval.pk, approval.status)
    return handled


def due_for_expiry(now=None):
    """Pending approvals past their expiry (a read, for the periodic expiry task)."""
    return PendingApproval.objects.filter(status=ApprovalStatus.PENDING, expires_at__lt=now or timezone.now())
