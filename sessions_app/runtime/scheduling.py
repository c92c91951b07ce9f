"""Asking for a runner (ARCHITECTURE §3): the bottom of the runtime, below the SessionEngine.

`wake` is the one way anything says "this Session has work": it flags a live runner (which
re-checks before releasing its lease) or enqueues `sessions.drive_session`. It touches only the
Session row and the broker, so every layer may call it — the engine when a delegation queues a
sub-Session's input, the goal driver when it queues a round, Brain after every input — without
importing the layers above.
"""

from __future__ import annotations

from django.utils import timezone

from ..models import Session
from ..tasks import drive_session


def wake(session_id) -> None:
    """Make sure a runner will look at this Session soon.

    If a live runner holds the lease, flag it (it re-checks before releasing); else enqueue one.
    """
    flagged = Session.objects.filter(
        pk=session_id, runner_token__isnull=False, lease_expires_at__gt=timezone.now()
    ).update(wake_requested=True)
    if not flagged:
        drive_session.delay(str(session_id))
