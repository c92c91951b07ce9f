"""The goal driver: a long task run as several rounds, within a round limit, a token budget and a
wall-clock budget. It owns `GoalRun` (the only writer) and the `goal.*` events.

A round is an ordinary `message` input of the Session (payload `goal_run_id`, `round`): it waits
in the queue like any message, runs as one turn through the same runner, tools and approvals,
and nothing about it bypasses a confirmation (a parked turn simply has not ended yet). When a
round's turn ends, SessionEngine calls `after_turn` in the same transaction (the Session row
locked), and the driver decides from the agent's claim checked against facts the product holds
(the xAgent / DeepSeek Harness way). The claim is the round's last `update_goal` call
(`complete` or `blocked`, with a reason), committed as that call's result before the agent wrote
its closing answer:

1. the turn did not end `completed` (blocked, max_tokens, aborted, error, interrupted) -> stop;
2. the tokens the Session spent since the run started reach the budget -> stop;
3. the wall-clock time since the run started reaches its budget -> stop;
4. the agent said `blocked` -> stop, with its reason;
5. the agent said `complete` and the facts agree (the round's delivery record clean: every check
   passed, no unresolved failure; no plan task of this run pending or in progress; no
   sub-Session still working) -> done;
6. the round limit is reached -> stop (saying whether the agent never claimed completion or
   what disagreed with its claim);
7. else continue: the next round is queued, its text naming each disagreement with the claim,
   or, without one, what the records still show open.

A round that did nothing is never `done`: without the agent's claim the run goes on, and
nothing the product records can stand in for it.

Budgets are checked between rounds, not inside one: a round runs to its end.

After any takeover of a lost runner (`pause_after_recovery`, from `engine.recover_lost_runner`)
an active run is paused, and a round it had queued but not started is withdrawn: the driver
never goes on by itself after a crash. A round already running is the turn's business (the
tenant's auto-continue setting); when it ends, the paused run counts it and decides nothing. A
person resumes (`resume`) or stops (`stop`) the run.
"""

from __future__ import annotations

import json
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from tenancy_app import audit
from tools_app.registry import GOAL_TOOL

from ..choices import (
    GoalDecision,
    GoalRunStatus,
    InputKind,
    InputStatus,
    PlanTaskStatus,
    Role,
    SessionKind,
    SessionStatus,
    TurnReason,
)
from ..models import Delivery, GoalRun, Input, Message, PlanTask, Session, Turn
from . import engine
from .events import emit
from .scheduling import wake

RECOVERY_PAUSE = "a runner was lost (recovery); resume it to continue"
OPEN_TASK_STATUSES = (PlanTaskStatus.PENDING, PlanTaskStatus.IN_PROGRESS)
LISTED_FACTS = 10  # per kind, in a round's text; the rest are counted


class GoalRunError(Exception):
    """A request the run's state refuses (the API answers 409 with `code`)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class NoGoalRun(Exception):
    """The Session has never had a goal run."""


# --- reads -------------------------------------------------------------------------------------


def current_run(session_id) -> GoalRun | None:
    """The Session's open run, else its latest one (None: it never had one)."""
    return GoalRun.objects.filter(session_id=session_id).order_by("-id").first()


def session_tokens(session_id) -> int:
    """Prompt + completion tokens the Session has spent, read from the row (a runner's fenced
    commits add to them with an UPDATE; an instance in memory may be behind)."""
    prompt, completion = (
        Session.objects.filter(pk=session_id).values_list("prompt_tokens", "completion_tokens").get()
    )
    return prompt + completion


def tokens_used(run: GoalRun, session_total: int | None = None) -> int:
    """What the run has spent: live while it is open, as of its last decision once it ended."""
    if not run.is_open:
        return run.tokens_used
    total = session_tokens(run.session_id) if session_total is None else session_total
    return max(0, total - run.tokens_at_start)


def elapsed_seconds(run: GoalRun, now: datetime | None = None) -> int:
    end = run.ended_at or now or timezone.now()
    return max(0, int((end - run.started_at).total_seconds()))


# --- a person's operations -------------------------------------------------------------------


def start(
    session_id, *, goal: str, max_rounds: int, token_budget: int, wall_clock_seconds: int, user=None
) -> GoalRun:
    """Start a goal run and queue its first round. Raises GoalRunError when the Session is
    archived (`session_archived`) or already has an open run (`goal_run_active`)."""
    if not goal.strip():
        raise ValueError("a goal run needs a goal")
    if not 1 <= max_rounds <= GoalRun.MAX_ROUNDS or token_budget < 1 or wall_clock_seconds < 1:
        raise ValueError("max_rounds must be 1..50, token_budget and wall_clock_seconds at least 1")
    person = user if getattr(user, "is_authenticated", False) else None
    with engine.locked_session(session_id) as session:
        if session.archived_at is not None:
            raise GoalRunError("session_archived", "This Session is archived.")
        if GoalRun.objects.filter(session=session, status__in=GoalRun.OPEN_STATUSES).exists():
            raise GoalRunError(
                "goal_run_active", "This Session already has a goal run that is active or paused."
            )
        run = GoalRun.objects.create(
            tenant_id=session.tenant_id,
            session=session,
            goal=goal,
            max_rounds=max_rounds,
            token_budget=token_budget,
            wall_clock_seconds=wall_clock_seconds,
            tokens_at_start=session_tokens(session.pk),
            created_by=person,
        )
        audit.record(
            "goal_run.started",
            tenant_id=session.tenant_id,
            obj=run,
            changes={
                name: {"after": value}
                for name, value in (
                    ("goal", goal[:500]),
                    ("max_rounds", max_rounds),
                    ("token_budget", token_budget),
                    ("wall_clock_seconds", wall_clock_seconds),
                )
            },
        )
        emit(
            session,
            "goal.started",
            {
                "goal_run_id": run.pk,
                "goal": goal,
                "max_rounds": max_rounds,
                "token_budget": token_budget,
                "wall_clock_seconds": wall_clock_seconds,
                "by": person.get_username() if person else None,
            },
        )
        if session.kind == SessionKind.MAIN:
            # The run's goal is the person's: it is the phase goal (and the session goal, if there
            # is none yet), not the framed text of round 1. A sub-Session's task understanding
            # reads the round itself.
            engine.set_goals(
                session,
                session_goal=None if session.session_goal else goal,
                phase_goal=goal,
                by=_name(person) or "",
            )
        _queue_round(session, run, 1, user=person)
        _wake_after_commit(session.pk)
    return run


def resume(session_id, user=None) -> GoalRun:
    """A person resumes a paused run. When no round of it is running or queued, the driver
    decides at once (budgets and the round limit first), as after a round. Resuming an active
    run changes nothing. Raises NoGoalRun, or GoalRunError `goal_run_finished`."""
    with engine.locked_session(session_id) as session:
        run = _latest_for_update(session)
        if run.status == GoalRunStatus.ACTIVE:
            return run
        if run.status != GoalRunStatus.PAUSED:
            raise GoalRunError("goal_run_finished", f"This goal run is {run.status}; start a new one.")
        run.status, run.paused_reason = GoalRunStatus.ACTIVE, ""
        run.save(update_fields=["status", "paused_reason"])
        emit(session, "goal.resumed", {"goal_run_id": run.pk, "by": _name(user)})
        if _round_pending(session, run):
            _wake_after_commit(session.pk)
        else:
            last = Turn.objects.filter(pk=run.last_turn_id).first() if run.last_turn_id else None
            _decide(session, run, last, resumed=True)
    return run


def stop(session_id, user=None) -> GoalRun:
    """A person stops the run: no further round. A round already running is not interrupted
    (the interrupt route does that); one queued and not started yet is withdrawn. Stopping a
    stopped run changes nothing. Raises NoGoalRun, or GoalRunError `goal_run_finished`."""
    with engine.locked_session(session_id) as session:
        run = _latest_for_update(session)
        if run.status == GoalRunStatus.STOPPED:
            return run
        if run.status == GoalRunStatus.DONE:
            raise GoalRunError("goal_run_finished", "This goal run is done; start a new one.")
        withdrawn = _withdraw_queued_round(run)
        _record(
            session,
            run,
            GoalDecision.STOP,
            f"stopped by {_name(user) or 'a person'}",
            run.rounds_done,
            withdrawn=withdrawn,
        )
        audit.record(
            "goal_run.stopped",
            tenant_id=session.tenant_id,
            obj=run,
            changes={"rounds_done": {"after": run.rounds_done}},
        )
    return run


# --- the runtime's hooks (the caller holds the Session lock) ----------------------------------------


def after_turn(session: Session, turn: Turn) -> None:
    """A turn ended (`engine.end_turn`): when it was a round of the Session's open run, count it
    and, unless the run is paused, decide what comes next."""
    run = (
        GoalRun.objects.select_for_update()
        .filter(session_id=session.pk, status__in=GoalRun.OPEN_STATUSES)
        .first()
    )
    if run is None or run.round_input_id is None:
        return
    payload = (
        Input.objects.filter(pk=run.round_input_id, turn_id=turn.pk).values_list("payload", flat=True).first()
    )
    if payload is None:
        return  # another message's turn: the run waits for its own round
    run.rounds_done = max(run.rounds_done, int(payload.get("round") or run.rounds_done + 1))
    run.last_turn = turn
    run.save(update_fields=["rounds_done", "last_turn"])
    if run.status == GoalRunStatus.ACTIVE:
        _decide(session, run, turn)


def pause_after_recovery(session: Session) -> GoalRun | None:
    """A runner took over from a lost one: an active run pauses until a person resumes it, and a
    round it queued that has not started is withdrawn (it would otherwise start by itself)."""
    run = (
        GoalRun.objects.select_for_update().filter(session_id=session.pk, status=GoalRunStatus.ACTIVE).first()
    )
    if run is None:
        return None
    withdrawn = _withdraw_queued_round(run)
    run.status, run.paused_reason = GoalRunStatus.PAUSED, RECOVERY_PAUSE
    run.save(update_fields=["status", "paused_reason"])
    emit(
        session,
        "goal.paused",
        {
            "goal_run_id": run.pk,
            "reason": RECOVERY_PAUSE,
            **({"withdrawn_input_id": withdrawn} if withdrawn else {}),
        },
    )
    return run


# --- deciding ------------------------------------------------------------------------------------


def _decide(session: Session, run: GoalRun, turn: Turn | None, *, resumed: bool = False) -> str:
    """Decide after round `run.rounds_done` (see the module docstring) and record it. On resume
    the last round's end reason does not stop the run (a person chose to go on), the rest does."""
    now = timezone.now()
    used = max(0, session_tokens(session.pk) - run.tokens_at_start)
    elapsed = now - run.started_at
    ended = run.rounds_done
    facts = _open_facts(session, turn, run.started_at)
    claim = _claim_of(turn)
    said = f" ({claim['reason']})" if claim else ""
    if session.archived_at is not None:
        decision, reason = GoalDecision.STOP, "the Session was archived"
    elif turn is not None and turn.reason != TurnReason.COMPLETED and not resumed:
        detail = f": {turn.reason_detail}" if turn.reason_detail else ""
        decision, reason = GoalDecision.STOP, f"round {ended} ended {turn.reason}{detail}"
    elif used >= run.token_budget:
        decision, reason = GoalDecision.STOP, f"token budget spent ({used} of {run.token_budget})"
    elif elapsed.total_seconds() >= run.wall_clock_seconds:
        decision = GoalDecision.STOP
        reason = f"wall-clock budget spent ({int(elapsed.total_seconds())} s of {run.wall_clock_seconds} s)"
    elif claim and claim["status"] == "blocked":
        decision, reason = (
            GoalDecision.STOP,
            f"round {ended}: the agent said it is blocked: {claim['reason']}",
        )
    elif claim and facts["clean"]:
        decision = GoalDecision.DONE
        reason = (
            f"round {ended}: the agent said the goal is complete{said}, and the product's records "
            "agree: every check passed, no unresolved failure, no open plan task, no sub-Session working"
        )
    elif run.rounds_done >= run.max_rounds:
        decision = GoalDecision.STOP
        reason = (
            f"round limit reached ({run.max_rounds} rounds): the agent said the goal is complete{said}, "
            f"but the product's records show {facts['summary']}"
            if claim
            else f"round limit reached ({run.max_rounds} rounds), the agent never said the goal was complete"
        )
    else:
        decision = GoalDecision.CONTINUE
        reason = f"round {ended + 1} of {run.max_rounds} queued: " + (
            f"the agent said the goal is complete, but the product's records show {facts['summary']}"
            if claim
            else "the agent has not said the goal is complete"
            + ("" if facts["clean"] else f"; the records show {facts['summary']}")
        )
    _record(session, run, decision, reason, ended, used=used, now=now, claim=claim)
    if decision == GoalDecision.CONTINUE:
        # The rounds are the starter's request: attributed to them, so a turn's memory rule (only
        # the owner's own turns recall and write the owner's memories) holds for every round.
        _queue_round(session, run, ended + 1, user=run.created_by, facts={**facts, "claim": claim})
        _wake_after_commit(session.pk)
    return decision


def _record(
    session: Session,
    run: GoalRun,
    decision: str,
    reason: str,
    round_number: int,
    *,
    used: int | None = None,
    now: datetime | None = None,
    withdrawn: int | None = None,
    claim: dict | None = None,
) -> None:
    now = now or timezone.now()
    run.tokens_used = max(0, session_tokens(session.pk) - run.tokens_at_start) if used is None else used
    run.last_decision, run.last_reason, run.last_decision_round = decision, reason[:1000], round_number
    fields = ["tokens_used", "last_decision", "last_reason", "last_decision_round"]
    if decision != GoalDecision.CONTINUE:
        run.status = GoalRunStatus.DONE if decision == GoalDecision.DONE else GoalRunStatus.STOPPED
        run.ended_at, run.paused_reason = now, ""
        fields += ["status", "ended_at", "paused_reason"]
    run.save(update_fields=fields)
    emit(
        session,
        "goal.decided",
        {
            "goal_run_id": run.pk,
            "round": round_number,
            "decision": decision,
            "reason": reason,
            "tokens_used": run.tokens_used,
            "elapsed_seconds": elapsed_seconds(run, now),
            # What the agent said (update_goal) in the round decided on; null: nothing.
            "claim": claim,
            **({"withdrawn_input_id": withdrawn} if withdrawn else {}),
        },
    )


def _claim_of(turn: Turn | None) -> dict | None:
    """The round's last `update_goal` claim (`{"status", "reason"}`), as its result was
    committed; None when the agent made none (or every attempt was refused)."""
    if turn is None:
        return None
    content = (
        Message.objects.filter(turn_id=turn.pk, role=Role.TOOL, tool_name=GOAL_TOOL, is_error=False)
        .order_by("-id")
        .values_list("content", flat=True)
        .first()
    )
    try:
        recorded = json.loads(content) if content else None
    except ValueError:
        return None
    if not isinstance(recorded, dict) or recorded.get("status") not in ("complete", "blocked"):
        return None
    return {"status": recorded["status"], "reason": str(recorded.get("reason") or "")[:1000]}


def _open_facts(session: Session, turn: Turn | None, run_started) -> dict:
    """What the product's own records still show open after `turn`: its delivery record's
    unresolved failures and failed checks, the plan's tasks not done or skipped, and the
    sub-Sessions still working."""
    delivery = Delivery.objects.filter(turn_id=turn.pk).first() if turn is not None else None
    failures = list(delivery.unresolved_failures) if delivery else []
    failed_checks = [check for check in (delivery.checks if delivery else []) if not check.get("ok")]
    # A plan nobody touched since the run started belongs to an earlier task, not to this run.
    tasks = list(
        PlanTask.objects.filter(
            plan__session_id=session.pk, plan__updated_at__gte=run_started, status__in=OPEN_TASK_STATUSES
        )
        .order_by("position")
        .values("task_id", "title", "status")
    )
    working = list(
        Session.objects.filter(parent_id=session.pk, archived_at__isnull=True)
        .filter(Q(current_turn__isnull=False) | Q(status=SessionStatus.QUEUED))
        .order_by("created_at")
        .values("id", "title", "status")
    )
    parts = []
    if delivery is None:
        parts.append("no delivery record" if turn is not None else "no round has ended yet")
    if failures:
        parts.append(_count(len(failures), "unresolved failure"))
    if failed_checks:
        parts.append(_count(len(failed_checks), "failed check"))
    if tasks:
        parts.append(_count(len(tasks), "open plan task"))
    if working:
        parts.append(_count(len(working), "sub-Session") + " still working")
    return {
        "clean": delivery is not None and not failures and not failed_checks and not tasks and not working,
        "failures": failures,
        "failed_checks": failed_checks,
        "tasks": tasks,
        "working": working,
        "summary": ", ".join(parts) or "nothing open",
    }


# --- rounds --------------------------------------------------------------------------------------


def _queue_round(
    session: Session, run: GoalRun, number: int, *, user=None, facts: dict | None = None
) -> Input:
    created = engine.queue_input(
        session,
        kind=InputKind.MESSAGE,
        # `goal`: what task understanding reads of round 1 in a sub-Session (the person's goal, not
        # the framing around it); later rounds continue the task and skip it.
        payload={
            "text": _round_text(run, number, facts),
            "goal_run_id": run.pk,
            "round": number,
            "goal": run.goal,
        },
        user=user,
    )
    run.round_input = created
    run.save(update_fields=["round_input"])
    return created


def _round_text(run: GoalRun, number: int, facts: dict | None) -> str:
    head = f"Goal run, round {number} of {run.max_rounds}.\n\nGoal:\n{run.goal}\n\n"
    if facts is None:
        return head + (
            "Work toward this goal. When it is met, call update_goal with status `complete` and the "
            "reason, then write your closing answer; if you cannot go on without a person, call it "
            "with status `blocked`. The product then checks its own records of the round (failed "
            "tool calls, checks of the files written, the plan's open tasks, sub-Sessions still "
            "working): the run ends done only when they agree with you. Without your claim the run "
            f"goes on, for at most {run.max_rounds} rounds. Keep the plan's task statuses true."
        )
    # A round withdrawn by a pause and queued again on resume follows no ended round.
    when = f"after round {number - 1}" if number > 1 else "so far"
    claim = facts.get("claim")
    lines = [f"What the product recorded {when} (its own checks, not claims):"]
    for failure in facts["failures"][:LISTED_FACTS]:
        summary = str(failure.get("summary", ""))[:300]
        lines.append(
            f"- unresolved failure: {failure.get('tool')} (call {failure.get('call_id')}): {summary}"
        )
    for check in facts["failed_checks"][:LISTED_FACTS]:
        detail = str(check.get("detail", ""))[:300]
        lines.append(f"- failed check: {check.get('path')} ({check.get('check')}): {detail}")
    for task in facts["tasks"][:LISTED_FACTS]:
        lines.append(f"- open plan task {task['task_id']} ({task['status']}): {task['title']}")
    for child in facts.get("working", [])[:LISTED_FACTS]:
        lines.append(f"- sub-Session still working: {child['title'] or child['id']} ({child['status']})")
    for key, label in (
        ("failures", "unresolved failures"),
        ("failed_checks", "failed checks"),
        ("tasks", "open tasks"),
    ):
        if len(facts[key]) > LISTED_FACTS:
            lines.append(f"- … and {len(facts[key]) - LISTED_FACTS} more {label}")
    if len(lines) == 1:
        lines.append(f"- {facts['summary']}")
    # The agent's claim after the records (the page shows the records, then this line).
    if claim:
        lines.append(
            f"You said the goal is complete ({claim['reason'][:300]}), but these records disagree with it."
        )
    elif number > 1:
        lines.append("You did not say the goal is complete (update_goal).")
    return (
        head
        + "\n".join(lines)
        + "\n\nContinue toward the goal: resolve what is listed, and keep the plan's task statuses true. "
        "When the goal is met, call update_goal with status `complete`; if you cannot go on, `blocked`."
    )


def _round_pending(session: Session, run: GoalRun) -> bool:
    """A round of the run is queued or its turn is still open."""
    if run.round_input_id is None:
        return False
    row = Input.objects.filter(pk=run.round_input_id).values("status", "turn_id").first()
    if row is None:
        return False
    if row["status"] == InputStatus.QUEUED:
        return True
    return row["turn_id"] is not None and row["turn_id"] == session.current_turn_id


def _withdraw_queued_round(run: GoalRun) -> int | None:
    """Take back the run's round input if it has not started (it is the driver's own input, never
    a person's): it leaves the queue without a turn. Returns its id."""
    if run.round_input_id is None:
        return None
    pending = list(Input.objects.filter(pk=run.round_input_id, status=InputStatus.QUEUED))
    if not pending:
        return None
    engine.consume_inputs(pending, None)
    return pending[0].pk


def _latest_for_update(session: Session) -> GoalRun:
    run = GoalRun.objects.select_for_update().filter(session_id=session.pk).order_by("-id").first()
    if run is None:
        raise NoGoalRun(f"session {session.pk} has no goal run")
    return run


def _wake_after_commit(session_id) -> None:
    transaction.on_commit(lambda: wake(session_id))


def _name(user) -> str | None:
    return user.get_username() if getattr(user, "is_authenticated", False) else None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"
