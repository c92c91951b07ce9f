"""Owner operations for PendingApproval: every status change is a compare-and-set, so two
simultaneous decisions have one winner, and an approved call is claimed for execution once."""

from __future__ import annotations

from django.utils import timezone

from .choices import ApprovalStatus
from .models import PendingApproval

DECISIONS = {"approve": ApprovalStatus.APPROVED, "reject": ApprovalStatus.REJECTED}


class AlreadyDecided(Exception):
    def __init__(self, approval: PendingApproval):
        super().__init__(f"approval {approval.pk} is already {approval.status}")
        self.approval = approval


class NotAllowedToDecide(Exception):
    pass


def record_decision(
    approval: PendingApproval, *, status: str, user=None, comment: str = ""
) -> PendingApproval:
    """pending -> approved/rejected/expired/cancelled, once. Raises AlreadyDecided for the loser."""
    now = timezone.now()
    won = PendingApproval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
        status=status,
        decided_by=user if getattr(user, "is_authenticated", False) else None,
        decided_at=now,
        comment=comment[:5000],
    )
    approval.refresh_from_db()
    if not won:
        raise AlreadyDecided(approval)
    return approval


def claim_execution(approval: PendingApproval) -> bool:
    """True for exactly one caller: the one that may run the approved call."""
    return bool(
        PendingApproval.objects.filter(
            pk=approval.pk, status=ApprovalStatus.APPROVED, executed_at__isnull=True
        ).update(executed_at=timezone.now())
    )


def record_execution(approval: PendingApproval, summary: str) -> None:
    PendingApproval.objects.filter(pk=approval.pk).update(execution_result=summary[:2000])


def due_for_expiry(now=None):
    return PendingApproval.objects.filter(status=ApprovalStatus.PENDING, expires_at__lt=now or timezone.now())
