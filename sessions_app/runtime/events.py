"""The one way an event is written and announced (STYLE §6).

`emit` appends a SessionEvent with the Session's next gap-free `seq` inside the caller's
transaction (which must hold the Session row lock) and schedules the broadcast for after
commit. The channel layer is only a notification bus: a consumer that misses a message
catches up from the log by `seq`.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from ..models import Session, SessionEvent

logger = logging.getLogger(__name__)


def session_group(session_id) -> str:
    return f"session-{str(session_id).replace('-', '')}"


def tenant_sessions_group(tenant_id) -> str:
    """Where `session.status` changes of a tenant's Sessions are announced (`/ws/sessions/`)."""
    return f"tenant-sessions-{tenant_id}"


def emit(session: Session, type: str, data: dict) -> SessionEvent:
    """Append one event; `session` must be the row locked in the current transaction."""
    session.last_event_seq += 1
    Session.objects.filter(pk=session.pk).update(last_event_seq=session.last_event_seq)
    event = SessionEvent.objects.create(
        tenant_id=session.tenant_id, session_id=session.pk, seq=session.last_event_seq, type=type, data=data
    )
    payload = event.as_dict()
    transaction.on_commit(lambda: broadcast(session.pk, {"type": "session.event", "event": payload}))
    if type == "session.status":
        # The list page follows every Session's status without one socket per Session.
        listed = {**payload, "session": str(session.pk)}
        transaction.on_commit(
            lambda: _group_send(
                tenant_sessions_group(session.tenant_id), {"type": "sessions.status", "event": listed}
            )
        )
    return event


def broadcast(session_id, message: dict) -> None:
    """Best effort: a lost notification costs latency, never data (clients re-read the log)."""
    _group_send(session_group(session_id), message)


def _group_send(group: str, message: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:  # the log is the truth; a broken bus must not fail a committed operation
        logger.warning("broadcast to %s failed", group, exc_info=True)


def broadcast_delta(session_id, model_call_id: int, text: str) -> None:
    """`model.delta`: live only, never logged, `seq` null (CONTRACT Events)."""
    broadcast(
        session_id,
        {
            "type": "session.delta",
            "event": {
                "seq": None,
                "type": "model.delta",
                "data": {"model_call_id": model_call_id, "text": text},
            },
        },
    )
