"""What a turn's end moves above the SessionEngine, applied by Brain (ARCHITECTURE §1, §3).

The engine ends a turn as a fact and, when that end matters to someone above it, marks the turn
`followups_pending` in the same commit (`engine.end_turn`). Here the layer above applies them,
under the Session's lock, and clears the mark in the same transaction:
- a delegated sub-Session's turn reports its result to the MainSession (`engine.report_to_parent`);
- a goal run's round is counted and the driver decides the next one (`goal_driver.after_turn`).

Brain applies them at the runner's next step boundary, before it looks at the queue (a goal run's
next round is queued before the runner could release its lease), and the recovery sweep wakes a
Session whose runner was lost in between, so a follow-up is never lost and never applied twice.
"""

from __future__ import annotations

from ..models import Turn
from . import engine, goal_driver


def apply_pending(session_id, token) -> int:
    """Apply the follow-ups of this Session's ended turns, oldest first. Returns how many turns."""
    if not Turn.objects.filter(session_id=session_id, followups_pending=True).exists():
        return 0
    with engine.locked_session(session_id, token) as session:
        turns = list(
            Turn.objects.select_for_update()
            .filter(session_id=session_id, followups_pending=True)
            .order_by("id")
        )
        for turn in turns:
            if session.parent_id is not None:
                engine.report_to_parent(session, turn, turn.reason, turn.reason_detail)
            goal_driver.after_turn(session, turn)
            Turn.objects.filter(pk=turn.pk).update(followups_pending=False)
    return len(turns)
