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
    """Periodic (beat): pending approvals past their expiry become `expired` (a rejection for the model)."""
    from .runtime.approvals import expire_due

    return expire_due()
