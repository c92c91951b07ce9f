"""Celery tasks of the runtime: small, idempotent, keyed by ids (STYLE §7)."""

from celery import shared_task


@shared_task(name="sessions.drive_session", ignore_result=True)
def drive_session(session_id: str) -> str:
    """Run one bounded slice for a Session. A duplicate or redelivered task finds the lease held and exits."""
    from .runtime.brain import drive

    return drive(session_id)


@shared_task(name="sessions.recover", ignore_result=True)
def recover() -> int:
    """Periodic sweep (beat) and worker start: wake Sessions with work but no live runner."""
    from .runtime.brain import recover_stale_sessions

    return recover_stale_sessions()


@shared_task(name="sessions.expire_approvals", ignore_result=True)
def expire_approvals() -> int:
    """Periodic (beat): pending approvals past their expiry become `expired`, which the model sees
    as a rejection. Each goes through `brain.submit_decision`, the same path as a person's decision."""
    from approvals_app.actions import AlreadyDecided, due_for_expiry
    from approvals_app.choices import ApprovalStatus

    from .runtime.brain import submit_decision

    count = 0
    for approval in due_for_expiry():
        try:
            submit_decision(
                approval, "reject", status=ApprovalStatus.EXPIRED, comment="expired without a decision"
            )
        except AlreadyDecided:  # a person decided it meanwhile
            continue
        count += 1
    return count
