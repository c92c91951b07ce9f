"""Brain: input scheduling and the single runner per Session (ARCHITECTURE §1, §3).

Every input is committed to the queue first, then `wake` makes sure a runner will look.
A runner is a `sessions.drive_session` task that claims the Session's lease with a
compare-and-set, works a bounded slice (a few steps or seconds), and either releases —
re-checking the queue and the wake flag in the releasing transaction — or re-enqueues
itself so long turns share workers fairly. A second runner never waits or fails: it sets
`wake_requested` and leaves. Concurrent input is queued, never rejected.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from dataclasses import dataclass

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from approvals_app import actions as approval_actions
from config.dbconn import hand_back_connections
from tenancy_app.models import Tenant

from .. import quotas
from ..choices import InputKind, InputStatus, QueueReason, SessionStatus, TurnReason
from ..models import Input, RunnerSlice, Session, Turn
from . import approvals, engine, followups, goal_driver, outer_loop, presence
from .agent import AgentService
from .scheduling import wake

logger = logging.getLogger(__name__)

SLICE_MAX_STEPS = 8
SLICE_MAX_SECONDS = 30.0

# Set once this process is going away (a worker's warm or cold shutdown, runstack stopping): a
# slice in flight stops at its next step boundary and hands its Session on, as when its budget
# is spent, instead of holding work a dying worker can no longer finish.
_handing_over = threading.Event()


# --- inputs --------------------------------------------------------------------------------------


def submit_input(
    session: Session,
    *,
    kind: str,
    text: str = "",
    attachments=None,
    user=None,
    idempotency_key=None,
    caller: str = "",
    extra: dict | None = None,
):
    """The one entry for every input (REST, WebSocket, browser): commit, then wake after commit.
    `caller` (`key:<id>` or `user:<id>`, default the user) owns the `idempotency_key`."""
    payload = {"text": text, **({"attachments": list(attachments)} if attachments else {}), **(extra or {})}
    with transaction.atomic():
        created_input, created = engine.enqueue_input(
            session.pk, kind=kind, payload=payload, idempotency_key=idempotency_key, user=user, caller=caller
        )
        if created:
            transaction.on_commit(lambda: wake(session.pk))
    return created_input, created


def submit_decision(approval, decision: str, *, user=None, comment: str = "", status: str | None = None):
    """A person's (or expiry's) decision on `approval`: the one entry for REST, WebSocket and expiry.

    Records it (`do_decide`, compare-and-set + `approval.decided`) under the Session lock, queues
    the `approval_decision` input in the same transaction, wakes a runner after commit. `status`
    overrides the one `decision` leads to (expiry: `expired`). Raises AlreadyDecided.
    """
    new_status = status or approval_actions.DECISIONS[decision]
    with transaction.atomic():
        with engine.locked_session(approval.session_id) as session:
            approval_actions.do_decide(session, approval, new_status, user=user, comment=comment)
        engine.enqueue_input(
            approval.session_id,
            kind=InputKind.APPROVAL_DECISION,
            payload={"approval_id": approval.pk, "decision": str(new_status)},
            user=user,
        )
        transaction.on_commit(lambda: wake(approval.session_id))
    return approval


def interrupt(session: Session, user=None):
    return submit_input(session, kind=InputKind.INTERRUPT, user=user)


def archive(session: Session, user=None) -> None:
    """Archive a Session; a turn still open is interrupted like any other (a pending approval is
    cancelled with it), since no route reaches an archived Session to stop it."""
    with transaction.atomic():
        if engine.archive_session(session.pk):
            interrupt(session, user=user)


# --- the lease -------------------------------------------------------------------------------------


def acquire(session_id) -> uuid.UUID | None:
    """Claim the runner lease (compare-and-set). None: someone else runs; they were flagged."""
    return claim(session_id)[0]


@dataclass(frozen=True)
class Claim:
    """What `claim_within_tenant_limit` found. `token` None: not this runner's (`over_limit`:
    the tenant is full and the Session waits `queued`; otherwise another runner holds it)."""

    tenant_id: int
    status: str
    token: uuid.UUID | None = None
    took_over: bool = False  # the lease lapsed without a release: a lost runner's work is left
    over_limit: bool = False
    interrupt_only: bool = False  # admitted over the tenant's limit only to apply an interrupt


def claim_within_tenant_limit(session_id) -> Claim | None:
    """`claim`, unless the tenant already runs XAGENT_TENANT_MAX_RUNNING Sessions. None: no such
    Session.

    Claim first, count after: each claim is committed before its count, so of claimers racing
    for a tenant's last place the last to count sees all of them — none is admitted over the
    limit. Two statements when all is well, no lock held between them. A lease already held
    (another runner) is not counted: that claim fails as always.

    Racers can also all count each other and all find the tenant full; stepping back then
    would leave every one of them queued with places free. So one over the limit decides
    again under the tenant's row lock (`_decide_over_limit`), one at a time: the last of them
    to decide counts only the Sessions really admitted, and takes a free place."""
    claimed = _claim_returning(session_id)
    if claimed is None:
        if not Session.objects.filter(pk=session_id).update(wake_requested=True):
            return None
        tenant_id, status = Session.objects.filter(pk=session_id).values_list("tenant_id", "status").get()
        return Claim(tenant_id=tenant_id, status=status)
    token, took_over, tenant_id, status = claimed
    claim = Claim(tenant_id=tenant_id, status=status, token=token, took_over=took_over)
    if _running_in_tenant(tenant_id) <= settings.XAGENT_TENANT_MAX_RUNNING:
        return claim
    return _decide_over_limit(session_id, claim)


def _decide_over_limit(session_id, claim: Claim) -> Claim:
    """A claim that counted the tenant over its limit: count again and step back if still so,
    one claimer of the tenant at a time.

    Each decision here counts what the ones before it left (its statement starts after the lock
    is granted and they committed), so of racers that all counted each other the last to decide
    sees only the admitted ones and itself. No one is admitted over the limit either way: every
    admission counts after its own claim committed (see `claim_within_tenant_limit`)."""
    with transaction.atomic():
        # FOR NO KEY UPDATE: a runner's commit (its rows' foreign keys take KEY SHARE on the
        # tenant) never waits on it. SQLite has no row locks and needs none: its transaction
        # (BEGIN IMMEDIATE, settings) already holds the database's one write lock.
        if connection.features.has_select_for_update:
            Tenant.objects.select_for_update(no_key=True).filter(pk=claim.tenant_id).values_list(
                "pk", flat=True
            ).first()
        if _running_in_tenant(claim.tenant_id) <= settings.XAGENT_TENANT_MAX_RUNNING:
            return claim
        # An interrupt never waits behind the limit: stopping work frees a place.
        if engine.queued_inputs(session_id, [InputKind.INTERRUPT]).exists():
            return dataclasses.replace(claim, interrupt_only=True)
        # Step back. A lapsed lease stays lapsed (not freed), so the runner that gets the place
        # still takes over and settles what the lost one left.
        stepped_back = (
            {"lease_expires_at": timezone.now()}
            if claim.took_over
            else {"runner_token": None, "runner_holder": "", "lease_expires_at": None}
        )
        Session.objects.filter(pk=session_id, runner_token=claim.token).update(
            wake_requested=False, **stepped_back
        )
    return Claim(tenant_id=claim.tenant_id, status=claim.status, over_limit=True)


def _claim_returning(session_id) -> tuple[uuid.UUID, bool, int, str] | None:
    """`claim`'s compare-and-set, returning what the runner needs of the row in the same
    statement: (token, took over, tenant id, status), or None when another runner holds it."""
    token = uuid.uuid4()
    now = timezone.now()
    field = Session._meta.get_field
    values = [
        field("runner_token").get_db_prep_value(token, connection),
        presence.holder_id(),
        field("lease_expires_at").get_db_prep_value(now + engine.lease_duration(), connection),
        False,
        field("id").get_db_prep_value(session_id, connection),
    ]
    table = connection.ops.quote_name(Session._meta.db_table)
    token_, holder, expires, wake_, id_, tenant, status = (
        connection.ops.quote_name(field(name).column)
        for name in (
            "runner_token",
            "runner_holder",
            "lease_expires_at",
            "wake_requested",
            "id",
            "tenant",
            "status",
        )
    )
    with connection.cursor() as cursor:
        for condition, extra, took_over in (
            (f"{token_} IS NULL", [], False),
            (f"{expires} < %s", [field("lease_expires_at").get_db_prep_value(now, connection)], True),
        ):
            # Django's update() returns a count only; RETURNING (PostgreSQL, SQLite ≥ 3.35) saves
            # the read of the tenant and status that every slice starts with.
            cursor.execute(
                f"UPDATE {table} SET {token_} = %s, {holder} = %s, {expires} = %s, {wake_} = %s"
                f" WHERE {id_} = %s AND {condition} RETURNING {tenant}, {status}",
                values + extra,
            )
            row = cursor.fetchone()
            if row is not None:
                return token, took_over, row[0], row[1]
    return None


def claim(session_id) -> tuple[uuid.UUID | None, bool]:
    """Claim the runner lease: (token or None, whether it was taken over from a lost runner —
    a lease that lapsed without being released, which is when calls can be left unanswered)."""
    claimed = _claim_returning(session_id)
    if claimed is None:
        Session.objects.filter(pk=session_id).update(wake_requested=True)
        return None, False
    token, took_over, _, _ = claimed
    return token, took_over


def release(session_id, token, *, keep_if_work: bool = True) -> bool:
    """Release the lease unless work remains. Returns True when the caller must keep draining.

    The check and the release share one transaction with the row lock, so an input committed
    at any moment is either seen here or finds the lease free and enqueues its own runner.

    Nearly always there is nothing left: then one conditional statement releases (four round
    trips fewer per turn). It is as safe as the lock: `wake` flags `wake_requested` on the row
    (which this statement re-reads if it waited for that write) or finds the lease already free
    and dispatches a runner itself. Anything else (work, a flag, a lost lease) takes the lock.
    """
    if keep_if_work:
        released = (
            Session.objects.filter(pk=session_id, runner_token=token, wake_requested=False)
            .exclude(engine.pending_work())
            .update(runner_token=None, runner_holder="", lease_expires_at=None)
        )
        if released:
            return False
    with engine.locked_session(session_id, token) as session:
        if keep_if_work and (session.wake_requested or engine.has_pending_work(session)):
            Session.objects.filter(pk=session_id).update(wake_requested=False)
            if engine.has_pending_work(session):
                return True
        Session.objects.filter(pk=session_id).update(
            runner_token=None, runner_holder="", lease_expires_at=None, wake_requested=False
        )
        return False


# --- the runner ----------------------------------------------------------------------------------------


@dataclass
class Progress:
    steps: int = 0  # model steps taken
    consumed: int = 0  # inputs consumed
    again: bool = False  # nothing done, but look again at once (the slice must re-read first)
    # The step ended its turn and nothing above the engine follows from it (no goal run's next
    # round, no parent's report): the slice may release without another boundary.
    turn_ended: bool = False
    quota_spent: object = None  # the step found a quota spent (quotas.Exceeded): the Session parks


def drive(session_id, *, max_steps: int = SLICE_MAX_STEPS, max_seconds: float = SLICE_MAX_SECONDS) -> str:
    """One bounded slice of work for one Session. Returns what happened (for logs and tests)."""
    presence.ensure_started()  # this process now holds leases: others must be able to see it alive
    claim = claim_within_tenant_limit(session_id)
    if claim is None:
        return "gone"
    tenant_id, status, token, took_over = claim.tenant_id, claim.status, claim.token, claim.took_over
    interrupt_only = claim.interrupt_only
    if claim.over_limit:
        # Waits as `queued` (with the reason) until one of the tenant's runners is done. One that
        # finished while this was being written could not see it: look once more.
        engine.queue_for_runner(session_id, QueueReason.TENANT_LIMIT)
        if _running_in_tenant(tenant_id) < settings.XAGENT_TENANT_MAX_RUNNING:
            wake(session_id)
        return "queued"
    if token is None:
        return "busy"
    audit = RunnerSlice.objects.create(
        tenant_id=tenant_id,
        session_id=session_id,
        token=token,
        worker=presence.holder_id(),
        started_at=timezone.now(),
    )
    agent = AgentService(session_id, token, holds_lease=True)
    steps = consumed = 0
    outcome = "released"
    deadline = time.monotonic() + max_seconds
    try:
        if status == SessionStatus.QUEUED:
            engine.leave_queue(session_id, token)
        if took_over:
            # Only a lost runner (a crash, a killed worker) leaves calls open: settle what it
            # left (ARCHITECTURE §6), and close its audit row, which it never could.
            RunnerSlice.objects.filter(session_id=session_id, ended_at__isnull=True).exclude(
                token=token
            ).update(ended_at=timezone.now(), outcome="lost")
            # A turn that keeps killing its workers is stopped first; what is left is recovered.
            stop_poisoned_turn(session_id, token)
            # Before recovery can end a turn: a goal run never goes on by itself after a lost runner.
            with engine.locked_session(session_id, token) as session:
                goal_driver.pause_after_recovery(session)
            recovery = engine.recover_lost_runner(session_id, token, rerun_kind=_rerun_kind(tenant_id))
            if recovery.found:
                logger.info("session %s recovered after a lost runner: %s", session_id, recovery.as_event())
        while True:
            if interrupt_only and consumed:
                # Let in over the tenant's limit for the interrupt alone: what is queued behind it
                # waits for a place like any other work.
                agent.pause()
                release(session_id, token, keep_if_work=False)
                if _has_work(session_id):
                    engine.queue_for_runner(session_id, QueueReason.TENANT_LIMIT)
                outcome = "interrupted_over_limit"
                break
            if steps >= max_steps or time.monotonic() >= deadline or _handing_over.is_set():
                agent.pause()
                release(session_id, token, keep_if_work=False)
                outcome = "yielded"
                break
            progress = _advance(agent)
            steps += progress.steps
            consumed += progress.consumed
            if progress.quota_spent is not None:
                # Parked until the limit is raised or a new period begins (`resume_quota_parked`).
                agent.pause()
                release(session_id, token, keep_if_work=False)
                engine.park_for_quota(session_id, progress.quota_spent.as_event())
                outcome = "quota_exceeded"
                break
            if (progress.steps or progress.consumed or progress.again) and not progress.turn_ended:
                continue
            # Nothing to do, or the turn just ended: release, unless work waits (release looks
            # at the queue and the wake flag under the row lock; then the loop goes on, and the
            # next boundary takes the work). A boundary right after a turn's end would mostly
            # find nothing: four statements and a lock per turn saved.
            agent.pause()
            if not release(session_id, token):
                break
    except engine.LeaseLost:
        outcome = "lease_lost"
    except Exception as exc:
        logger.exception("runner for session %s crashed", session_id)
        outcome = "error"
        _fail_open_turn(session_id, token, exc)
    finally:
        agent.close()
        # The slice's own audit row, keyed by its own token: a slice that lost its lease still
        # records that it did, and never touches what the new lease holder writes.
        RunnerSlice.objects.filter(pk=audit.pk, token=token).update(
            ended_at=timezone.now(), steps=steps, inputs_consumed=consumed, outcome=outcome
        )
    if outcome == "yielded":
        wake(session_id)
    wake_tenant_queue(tenant_id)
    return outcome


def _has_work(session_id) -> bool:
    session = Session.objects.filter(pk=session_id).first()
    return session is not None and engine.has_pending_work(session)


def _running_in_tenant(tenant_id) -> int:
    """Sessions of the tenant whose runner holds a live lease."""
    return Session.objects.filter(
        tenant_id=tenant_id, runner_token__isnull=False, lease_expires_at__gte=timezone.now()
    ).count()


def wake_tenant_queue(tenant_id, *, limit: int = 1, again: bool = False) -> int:
    """A runner of the tenant is done: wake the Sessions of the tenant that waited longest as
    `queued` for its limit (each gets its turn at the tenant's places, oldest first).

    A woken Session is marked (`wake_requested`, unused while no runner holds its lease) in the
    same transaction that picks it, rows locked by another picker skipped, so runners that end
    together wake different Sessions; a claim clears the mark. `again`: the sweep's safety net,
    which also wakes marked ones (a wake whose task was lost)."""
    waiting = Session.objects.filter(
        tenant_id=tenant_id, status=SessionStatus.QUEUED, runner_token__isnull=True
    ).exclude(status_reason=QueueReason.QUOTA_EXCEEDED)  # those wait for their quota, not a place
    if not again:
        waiting = waiting.filter(wake_requested=False)
    # Every runner's end asks; the tenant's queue is nearly always empty, and this look (what
    # the locking read below would see, committed rows only) costs one statement, not three.
    if not waiting.exists():
        return 0
    with transaction.atomic():
        waiting = waiting.order_by("updated_at")
        if connection.features.has_select_for_update_skip_locked:
            waiting = waiting.select_for_update(skip_locked=True)
        picked = list(waiting.values_list("pk", flat=True)[:limit])
        if picked:
            Session.objects.filter(pk__in=picked).update(wake_requested=True)
    for session_id in picked:
        wake(session_id)
    return len(picked)


def _advance(agent: AgentService) -> Progress:
    """Do the next unit of work. While the slice's context is current this is one step and
    nothing else; at a step boundary (the first step, after an input, a turn's end or a change
    elsewhere) the queue and the Session are looked at first."""
    if agent.current:
        try:
            return _step(agent)
        except engine.StaleSlice:
            return Progress(again=True)
    session_id, token = agent.session_id, agent.token
    # A turn that ended may move what sits above the engine (a goal run's next round, a parent's
    # report): applied before the queue is looked at.
    followups.apply_pending(session_id, token)
    boundary = engine.take_boundary(session_id, token, on_parked=approvals.cancel_waiting, start_next=True)
    if boundary.interrupted:
        agent.interrupted()
        return Progress(consumed=boundary.consumed)
    if boundary.turn_id is not None:
        if boundary.status == SessionStatus.WAITING_APPROVAL:
            approval, consumed = approvals.take_decision(session_id, token)
            if approval is None:
                return Progress(consumed=consumed)
            agent.prepare(boundary.turn_id)
            agent.resume(approval)
            agent.invalidate()
            return Progress(steps=1, consumed=consumed)
        if boundary.status not in engine.ACTIVE_STATUSES:
            return Progress()  # parked: new messages wait until the turn ends
        if boundary.status == SessionStatus.PREPARING:
            # A sub-Session's turn is understood (and its capabilities orchestrated) first: model
            # calls too, so a spent quota parks the Session before them (it prepares on resuming).
            spent = quotas.spent_for_session(Session.objects.only("tenant_id", "owner_id").get(pk=session_id))
            if spent is not None:
                return Progress(quota_spent=spent)
            outer_loop.prepare_turn(agent, boundary.turn_id)
            return Progress(steps=1, consumed=boundary.consumed)
        agent.prepare(boundary.turn_id)
        if agent.run_pending_calls():
            # Calls recovery left to run again went first; look at the queue before the next step.
            agent.invalidate()
            return Progress(steps=1, consumed=boundary.consumed)
        try:
            return dataclasses.replace(_step(agent), consumed=boundary.consumed)
        except engine.StaleSlice:
            return Progress(consumed=boundary.consumed, again=True)
    turn = boundary.started
    if turn is None:
        # Anything else still queued (e.g. a decision for a future approval) stays for its owner.
        return Progress()
    if turn.session_status != SessionStatus.RUNNING:
        return Progress(consumed=1)  # the outer loop understands the task first
    # The first step follows at once, without another boundary: whatever one would find (an
    # interrupt, guidance, a configuration change) flags the Session, so the step's opening
    # commit finds it too and nothing is done (StaleSlice); the boundary then runs.
    agent.prepare(turn.pk, started=turn)
    try:
        return dataclasses.replace(_step(agent), consumed=1)
    except engine.StaleSlice:
        return Progress(consumed=1, again=True)


def _step(agent: AgentService) -> Progress:
    result = agent.step()
    if result.quota_spent is not None:
        return Progress(quota_spent=result.quota_spent)
    return Progress(steps=1, turn_ended=bool(result.ended) and not result.followups)


def hand_over_slices() -> None:
    """This process is shutting down: every slice running in it yields at its next step boundary
    (releases the lease and re-enqueues its Session for another worker)."""
    _handing_over.set()


def stop_poisoned_turn(session_id, token) -> bool:
    """Called by a runner that took over from lost ones (their audit rows just marked `lost`).

    When the open turn's runner was lost XAGENT_POISON_SLICE_ATTEMPTS times in a row — no slice
    ended normally in between — the same point of the turn kills every worker that runs it (an
    OOM, a segfault, the hard time limit): end the turn `error` and the Session `failed` with the
    reason and an `error` event, rather than hand it to the next worker. Queued inputs stay queued.
    """
    attempts = settings.XAGENT_POISON_SLICE_ATTEMPTS
    with engine.locked_session(session_id, token) as session:
        turn = session.current_turn
        if turn is None or session.status not in engine.ACTIVE_STATUSES:
            return False  # a parked turn waits for a person; nothing of it runs
        recent = (
            RunnerSlice.objects.filter(session_id=session_id)
            .exclude(token=token)
            .order_by("-id")
            .values_list("outcome", "ended_at")[:attempts]
        )
        # Losses noticed before this turn began belong to an earlier turn.
        lost = 0
        for outcome, ended_at in recent:
            if outcome != "lost" or ended_at is None or ended_at < turn.started_at:
                break
            lost += 1
        if lost < attempts:
            return False
        reason = f"the runner was lost {lost} times in a row at this point; stopped to protect the workers"
        engine.answer_open_calls(session)  # nothing of it runs again, and its history stays valid
        engine.settle_pending_compaction(session)
        engine.fail_turn(session, turn, code="poisoned_slice", reason=reason)
    logger.warning("session %s: %s", session_id, reason)
    return True


def _failure_reason(exc: Exception) -> str:
    if isinstance(exc, SoftTimeLimitExceeded):
        return (
            f"the slice exceeded its time limit ({settings.XAGENT_SLICE_SOFT_TIME_LIMIT} s, "
            "XAGENT_SLICE_SOFT_TIME_LIMIT); the turn was stopped"
        )
    return f"internal error: {exc.__class__.__name__}"


def _fail_open_turn(session_id, token, exc: Exception) -> None:
    """A crash inside the slice: close the turn `error` so the Session never looks busy forever."""
    reason = _failure_reason(exc)
    try:
        with engine.locked_session(session_id, token) as session:
            # A call or model call the crash left open gets its `interrupted` answer, so the
            # history the next turn sends stays valid.
            engine.answer_open_calls(session)
            if session.current_turn is not None:
                engine.end_turn(session, session.current_turn, TurnReason.ERROR, reason)
            else:
                engine.set_status(session, SessionStatus.FAILED, reason)
        release(session_id, token, keep_if_work=False)
    except engine.LeaseLost:
        pass
    except Exception:
        logger.exception("could not close the turn of session %s after a crash", session_id)


def _rerun_kind(tenant_id: int):
    """Why a tool may run again after its runner was lost: "read-only", "idempotent" or ""
    (the tenant's view of the tool: an admin may have re-flagged it)."""
    from tools_app.catalog import resolve_one

    def kind(name: str) -> str:
        tool = resolve_one(tenant_id, name)
        if tool is None:
            return ""
        return "read-only" if tool.read_only else "idempotent" if tool.idempotent else ""

    return kind


# --- recovery sweeps ---------------------------------------------------------------------------------


def expire_lease(session_id, token, holder: str) -> bool:
    """End the lease `holder` holds with `token` now, if it still does (compare-and-set: a lease
    that changed hands meanwhile is left alone). The token stays, so the next claim is a
    takeover and settles what the lost runner left; if the holder was alive after all, its next
    fenced commit finds the new token and stops (LeaseLost)."""
    return bool(
        Session.objects.filter(pk=session_id, runner_token=token, runner_holder=holder).update(
            lease_expires_at=timezone.now()
        )
    )


def recover_stale_sessions() -> int:
    """The recovery sweep (worker start, beat every few seconds, the embedded timer). Returns how
    many Sessions it woke.

    1. Leases whose holder is gone (runtime/presence.py) are expired at once, with a
       compare-and-set on (token, holder) so a lease that changed hands meanwhile is left alone;
       the next claim takes over (`took_over`) and `recover_lost_runner` settles what was left.
    2. Sessions with work and no live runner are woken: an open turn at work, or an input the
       runner would take (`has_pending_work`, as a query). Idle Sessions are never woken.
    Three small queries when nothing is wrong.
    """
    now = timezone.now()
    expired = set()
    leased = list(
        Session.objects.filter(runner_token__isnull=False, lease_expires_at__gte=now)
        .exclude(runner_holder="")
        .values_list("pk", "runner_token", "runner_holder")
    )
    gone = presence.gone_holders({holder for _, _, holder in leased})
    for session_id, token, holder in leased:
        if holder in gone and expire_lease(session_id, token, holder):
            logger.warning("session %s: lease holder %s is gone; taking over", session_id, holder)
            expired.add(session_id)

    def queued(kinds):
        return Input.objects.filter(status=InputStatus.QUEUED, kind__in=kinds).values("session_id")

    stale = (
        Session.objects.filter(archived_at__isnull=True)
        .filter(Q(runner_token__isnull=True) | Q(lease_expires_at__lt=now))
        .filter(
            Q(status__in=[SessionStatus.RUNNING, SessionStatus.PREPARING])
            # Compressing is work only for a takeover (a lapsed lease) or when no turn is open
            # (it then fails): woken otherwise, a runner would find nothing to do, every sweep.
            | Q(status=SessionStatus.COMPRESSING)
            & (Q(current_turn__isnull=True) | Q(runner_token__isnull=False))
            | Q(current_turn__isnull=True, pk__in=queued(engine.WORK_WITHOUT_A_TURN))
            # (one waiting for its tenant's limit is woken below, as places free)
            & ~Q(status=SessionStatus.QUEUED)
            | Q(current_turn__isnull=False, pk__in=queued(engine.WORK_FOR_A_PARKED_TURN))
            # A turn ended but what it moves above the engine was not applied (runner lost).
            | Q(pk__in=Turn.objects.filter(followups_pending=True).values("session_id"))
        )
    )
    woken = expired | set(stale.values_list("pk", flat=True))
    for session_id in woken:
        wake(session_id)
    return len(woken) + _wake_queued()


def _wake_queued() -> int:
    """Sessions waiting as `queued`: for their tenant's limit, as many per tenant as it has free
    places (a safety net: a finishing runner normally wakes the next one itself); for a spent
    quota, those whose quotas renewed (a new day or month). One query when none waits."""
    waiting = (
        Session.objects.filter(
            status=SessionStatus.QUEUED, runner_token__isnull=True, archived_at__isnull=True
        )
        .values_list("tenant_id", "status_reason")
        # Without clearing Session's default ordering, DISTINCT also takes `created_at`: one row
        # per queued Session, and each one woke the tenant's free places again (at N = 1,000 in
        # `make bench`, ~2,500 duplicate drive tasks from one sweep, all finding the lease held).
        .order_by()
        .distinct()
    )
    for_places, for_quotas = set(), set()
    for tenant_id, reason in waiting:
        (for_quotas if reason == QueueReason.QUOTA_EXCEEDED else for_places).add(tenant_id)
    woken = 0
    for tenant_id in for_places:
        free = settings.XAGENT_TENANT_MAX_RUNNING - _running_in_tenant(tenant_id)
        if free > 0:
            woken += wake_tenant_queue(tenant_id, limit=free, again=True)
    for tenant_id in for_quotas:
        woken += resume_quota_parked(tenant_id, only_unspent=True)
    return woken


def resume_quota_parked(tenant_id=None, *, only_unspent: bool = False) -> int:
    """Wake the Sessions parked for a spent quota (of `tenant_id`, or every tenant): after a
    quota changed (all of them: a step checks again before its call, and parks again if it must)
    or, from the sweep, those whose quotas are no longer spent (a new day or month)."""
    parked = Session.objects.filter(
        status=SessionStatus.QUEUED,
        status_reason=QueueReason.QUOTA_EXCEEDED,
        runner_token__isnull=True,
        archived_at__isnull=True,
    )
    if tenant_id is not None:
        parked = parked.filter(tenant_id=tenant_id)
    rows = list(parked.values_list("pk", "tenant_id", "owner_id"))
    rules, still_spent = {}, {}
    woken = 0
    for session_id, tenant, owner in rows:
        if only_unspent:
            if tenant not in rules:
                rules[tenant] = quotas.rules(tenant)
            if (tenant, owner) not in still_spent:
                still_spent[tenant, owner] = quotas.spent(tenant, owner, rules[tenant]) is not None
            if still_spent[tenant, owner]:
                continue
        wake(session_id)
        woken += 1
    return woken


_timer_lock = threading.Lock()
_timer: threading.Thread | None = None


def start_recovery_timer() -> threading.Thread:
    """Run the recovery sweep every XAGENT_RECOVERY_SWEEP_SECONDS in this process (once per
    process): embedded mode has no beat, and a restarted embedded stack must take over the turns
    its previous process was running."""
    global _timer
    with _timer_lock:
        if _timer is not None and _timer.is_alive():
            return _timer
        _timer = threading.Thread(target=_sweep_forever, name="xagent-recovery-sweep", daemon=True)
        _timer.start()
        return _timer


def _sweep_forever() -> None:
    from django.conf import settings
    from django.db import close_old_connections

    interval = settings.XAGENT_RECOVERY_SWEEP_SECONDS
    while True:
        try:
            close_old_connections()
            recover_stale_sessions()
        except Exception:
            logger.warning("recovery sweep failed", exc_info=True)
        # Not held through the sleep: the process's pooled connections serve its runners.
        hand_back_connections()
        time.sleep(interval)
