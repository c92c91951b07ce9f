"""XAGENT_TENANT_MAX_RUNNING in-process (brain.claim_within_tenant_limit, wake_tenant_queue, the
sweep's safety net): a tenant at its limit keeps its other Sessions `queued` with the reason
`tenant_limit`, nothing they hold is lost, another tenant is not affected, a runner of the tenant
that ends wakes the Session that waited longest, an interrupt never waits behind the limit, and
the recovery sweep wakes a queued Session once its tenant has a free place.

Slices are driven by hand (`brain.drive`); `brain.wake` is recorded instead of enqueuing a
Celery task, so what a finishing runner or the sweep wakes is observable. The model is the
scripted server. The same limit on a real worker: tests/integration/test_tenant_fair_share.py.
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from config.dbconn import hand_back_connections
from sessions_app.models import Input, RunnerSlice, Session, SessionEvent, Turn
from sessions_app.runtime import brain, engine, presence
from tests.support.model_server import text_reply

from .helpers import assert_gap_free, new_session, send

pytestmark = pytest.mark.django_db(transaction=True)

QUEUED = {"status": "queued", "reason": "tenant_limit"}


@pytest.fixture(autouse=True)
def limit_of_one(settings):
    settings.XAGENT_TENANT_MAX_RUNNING = 1


@pytest.fixture
def woken(monkeypatch):
    """The Sessions `brain.wake` was asked to wake, in order (nothing is enqueued)."""
    calls = []
    monkeypatch.setattr(brain, "wake", calls.append)
    return calls


def statuses(session):
    return list(
        SessionEvent.objects.filter(session=session, type="session.status")
        .order_by("seq")
        .values_list("data", flat=True)
    )


def an_open_turn_without_a_runner(session, text="the long task"):
    """A Session whose turn is open but whose runner let go of it (a slice that yielded): the
    next runner continues the turn."""
    send(session, text)
    token = brain.acquire(session.pk)
    turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    brain.release(session.pk, token, keep_if_work=False)
    return turn


def test_a_session_over_the_limit_waits_queued_and_runs_once_the_first_runner_ends(
    tenant_a, owner_a, tenant_b, outsider_b, model_config_a, model_config_b, model_server, woken, api_owner_a
):
    first, second = (
        new_session(tenant_a, owner_a, title="first"),
        new_session(tenant_a, owner_a, title="second"),
    )
    other_tenant = new_session(tenant_b, outsider_b, title="bravo")
    gate, first_asked = threading.Event(), threading.Event()

    def model(request):
        if "first task" in request.messages[-1]["content"]:
            first_asked.set()
            assert gate.wait(timeout=30), "the test never let the first model call answer"
            return text_reply("first done")
        return text_reply(f"done: {request.messages[-1]['content']}")

    model_server.default("agent", model)
    send(first, "the first task")
    outcomes = {}

    def run_first():
        try:
            outcomes["first"] = brain.drive(first.pk)
        finally:
            connection.close()

    runner = threading.Thread(target=run_first)
    runner.start()
    try:
        # A's first runner holds a live lease while its model call is in flight.
        assert first_asked.wait(timeout=30)
        assert Session.objects.get(pk=first.pk).runner_token is not None
        message = send(second, "the second task")

        assert brain.drive(second.pk) == "queued"

        second.refresh_from_db()
        assert (second.status, second.status_reason, second.runner_token) == ("queued", "tenant_limit", None)
        assert statuses(second)[-1] == QUEUED
        assert Input.objects.get(pk=message.pk).status == "queued"  # kept, not consumed or lost
        assert not Turn.objects.filter(session=second).exists()
        assert not RunnerSlice.objects.filter(session=second).exists()
        body = api_owner_a.get(f"/api/v1/sessions/{second.pk}/").json()
        assert (body["status"], body["status_reason"]) == ("queued", "tenant_limit")
        # Another tenant's places are its own.
        send(other_tenant, "bravo task")
        assert brain.drive(other_tenant.pk) == "released"
        assert Turn.objects.get(session=other_tenant).reason == "completed"
        assert woken == []  # no place of A was freed yet: nothing of A is woken
    finally:
        gate.set()
        runner.join(timeout=30)
    assert outcomes["first"] == "released"

    # The ending runner woke the Session that waited; its runner takes the free place.
    assert woken == [second.pk]
    assert brain.drive(second.pk) == "released"
    second.refresh_from_db()
    assert (second.status, second.status_reason) == ("idle", "")
    assert Input.objects.get(pk=message.pk).status == "consumed"
    turn = Turn.objects.get(session=second)
    assert turn.reason == "completed"
    assert [s["status"] for s in statuses(second)] == ["idle", "queued", "idle", "running", "idle"]
    assert not SessionEvent.objects.filter(
        session=first, type="session.status", data__status="queued"
    ).exists()
    assert_gap_free(second)


def test_the_session_that_waited_longest_is_woken_first(tenant_a, owner_a, model_config_a, woken):
    holder = new_session(tenant_a, owner_a, title="holder")
    waiting = [new_session(tenant_a, owner_a, title=f"waiting {n}") for n in range(3)]
    token = brain.acquire(holder.pk)
    for session in waiting:
        send(session, "queued work")
        assert brain.drive(session.pk) == "queued"
    # Asked again while the tenant is still full, the first keeps its place in the line.
    assert brain.drive(waiting[0].pk) == "queued"
    brain.release(holder.pk, token)

    assert brain.wake_tenant_queue(tenant_a.pk) == 1
    assert woken == [waiting[0].pk]
    # The woken one is marked until its runner claims: the next free places go to the others.
    assert brain.wake_tenant_queue(tenant_a.pk, limit=5) == 2
    assert woken[1:] == [s.pk for s in waiting[1:]]
    # The sweep's safety net wakes them all again, oldest first (a wake whose task was lost).
    assert brain.wake_tenant_queue(tenant_a.pk, limit=5, again=True) == 3
    assert woken[3:] == [s.pk for s in waiting]


def test_an_interrupt_is_applied_to_a_queued_session_even_at_the_limit(
    tenant_a, owner_a, model_config_a, model_server, woken
):
    holder, waiting = new_session(tenant_a, owner_a, title="holder"), new_session(tenant_a, owner_a)
    holder_token = brain.acquire(holder.pk)  # A's one place is taken by a live runner
    turn = an_open_turn_without_a_runner(waiting)
    assert brain.drive(waiting.pk) == "queued"
    waiting.refresh_from_db()
    assert (waiting.status, waiting.current_turn_id) == ("queued", turn.pk)

    brain.interrupt(waiting)
    assert woken == [waiting.pk]
    assert brain.drive(waiting.pk) == "interrupted_over_limit"

    waiting.refresh_from_db()
    assert (waiting.status, waiting.runner_token, waiting.current_turn_id) == ("interrupted", None, None)
    turn.refresh_from_db()
    assert (turn.reason, turn.reason_detail) == ("aborted", "interrupted by the user")
    assert not Input.objects.filter(session=waiting, status="queued").exists()
    assert not model_server.requests_for("agent")  # nothing ran: it was stopped, not resumed
    assert statuses(waiting)[-2:] == [
        {"status": "running"},
        {"status": "interrupted", "reason": "interrupted by the user"},
    ]
    # The place stayed the holder's.
    holder.refresh_from_db()
    assert holder.runner_token == holder_token


def test_the_sweep_wakes_a_queued_session_once_its_tenant_has_a_free_place(
    tenant_a, owner_a, model_config_a, model_server, woken
):
    presence.beat()  # this process is alive: the sweep leaves its leases alone
    holder, waiting = new_session(tenant_a, owner_a, title="holder"), new_session(tenant_a, owner_a)
    holder_token = brain.acquire(holder.pk)
    turn = an_open_turn_without_a_runner(waiting)
    assert brain.drive(waiting.pk) == "queued"

    assert brain.recover_stale_sessions() == 0  # the tenant is full: nothing to wake
    assert woken == []

    # The holder's place frees without its runner waking anyone (it was lost, or its wake was).
    brain.release(holder.pk, holder_token)
    assert brain.recover_stale_sessions() == 1
    assert woken == [waiting.pk]

    model_server.script("agent", text_reply("continued"))
    assert brain.drive(waiting.pk) == "released"
    waiting.refresh_from_db()
    assert (waiting.status, waiting.status_reason) == ("idle", "")
    turn.refresh_from_db()
    assert turn.reason == "completed"
    assert brain.recover_stale_sessions() == 0


def test_the_sweep_leaves_sessions_waiting_for_a_full_tenant_alone(tenant_a, owner_a, model_config_a, woken):
    presence.beat()
    holder, waiting = new_session(tenant_a, owner_a, title="holder"), new_session(tenant_a, owner_a)
    brain.acquire(holder.pk)
    send(waiting, "a new task")  # waits to start a turn (no turn open)
    assert brain.drive(waiting.pk) == "queued"

    brain.recover_stale_sessions()
    assert woken == []


def test_runners_that_end_together_wake_different_waiting_sessions(
    settings, tenant_a, owner_a, model_config_a, woken
):
    settings.XAGENT_TENANT_MAX_RUNNING = 2
    holders = [new_session(tenant_a, owner_a, title=f"holder {n}") for n in range(2)]
    tokens = [brain.acquire(holder.pk) for holder in holders]
    waiting = [new_session(tenant_a, owner_a, title=f"waiting {n}") for n in range(3)]
    for session in waiting:
        send(session, "queued work")
        assert brain.drive(session.pk) == "queued"

    # Both runners end (each releases, then wakes the tenant's line, as `brain.drive` does) before
    # the first Session woken has claimed its place.
    for holder, token in zip(holders, tokens, strict=True):
        brain.release(holder.pk, token)
        brain.wake_tenant_queue(tenant_a.pk)

    assert woken == [waiting[0].pk, waiting[1].pk]


def test_a_session_let_in_over_the_limit_for_an_interrupt_does_not_start_its_next_turn(
    tenant_a, owner_a, model_config_a, model_server, woken
):
    holder, waiting = new_session(tenant_a, owner_a, title="holder"), new_session(tenant_a, owner_a)
    brain.acquire(holder.pk)  # A's one place is taken by a live runner
    an_open_turn_without_a_runner(waiting)
    send(waiting, "the next task")  # queued behind the open turn
    assert brain.drive(waiting.pk) == "queued"

    brain.interrupt(waiting)
    assert brain.drive(waiting.pk) == "interrupted_over_limit"

    waiting.refresh_from_db()
    # The interrupt was applied; the next message waits for a place like any other work.
    assert (waiting.status, waiting.status_reason, waiting.runner_token) == ("queued", "tenant_limit", None)
    assert waiting.current_turn_id is None
    assert Input.objects.filter(session=waiting, kind="message", status="queued").count() == 1
    assert not model_server.requests_for("agent")


def test_claims_racing_for_the_last_places_never_admit_more_than_the_limit(
    tenant_a, owner_a, model_config_a, settings, woken
):
    """Claim first, count after (no tenant lock): of claimers racing at once the last to count
    sees them all, so the tenant never runs more than its limit; the ones that stepped back hold
    no lease and lose nothing."""
    settings.XAGENT_TENANT_MAX_RUNNING = 2
    sessions = [new_session(tenant_a, owner_a, title=f"racer {n}") for n in range(8)]
    for session in sessions:
        send(session, "work")
    start = threading.Barrier(len(sessions))

    admitted = race_claims(sessions, before_claim=lambda: start.wait(timeout=10))

    assert 1 <= len(admitted) <= 2, admitted


def race_claims(sessions, before_claim=lambda: None) -> set:
    """Each of `sessions` claims in its own thread at once; returns the admitted ones, having
    checked what holds for every race: each claimer got an answer, the others were refused for
    the limit, only the admitted hold a lease, and no input was lost."""
    claims = {}

    def claim(session):
        try:
            before_claim()
            claims[session.pk] = brain.claim_within_tenant_limit(session.pk)
        finally:
            connection.close()

    racers = [threading.Thread(target=claim, args=(s,)) for s in sessions]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=30)

    admitted = {pk for pk, found in claims.items() if found.token is not None}
    assert len(claims) == len(sessions), claims
    assert all(found.over_limit for pk, found in claims.items() if pk not in admitted)
    leased = set(Session.objects.filter(runner_token__isnull=False).values_list("pk", flat=True))
    assert leased == admitted
    assert Input.objects.filter(status="queued").count() == len(sessions)
    return admitted


def test_claimers_that_all_count_each_other_over_the_limit_still_fill_its_places(
    tenant_a, owner_a, model_config_a, settings, woken, monkeypatch
):
    """CI caught the race above leaving no one admitted: all eight had claimed before any
    counted, so each counted eight and stepped back, and the tenant's places stayed empty. Here
    every first count waits until all have claimed, so that interleaving happens each time: the
    ones over the limit decide again one at a time, and the last two take the two places."""
    settings.XAGENT_TENANT_MAX_RUNNING = 2
    sessions = [new_session(tenant_a, owner_a, title=f"racer {n}") for n in range(8)]
    for session in sessions:
        send(session, "work")
    all_claimed, counted = threading.Barrier(len(sessions)), threading.local()
    count = brain._running_in_tenant

    def count_once_all_claimed(tenant_id):
        if not getattr(counted, "before", False):
            counted.before = True
            # Eight threads parked on a barrier need not hold eight of the process's pooled
            # connections (other tests' threads may hold some): give it back while waiting.
            hand_back_connections()
            all_claimed.wait(timeout=20)
        return count(tenant_id)

    monkeypatch.setattr(brain, "_running_in_tenant", count_once_all_claimed)

    admitted = race_claims(sessions)

    assert len(admitted) == 2, admitted


def test_a_lapsed_lease_stays_lapsed_when_its_claimer_steps_back_for_the_limit(
    tenant_a, owner_a, model_config_a, woken
):
    """A runner that finds the tenant full after taking over a lost runner's lease leaves it
    lapsed (not free): the runner that gets the place still takes over and settles what the lost
    one left."""
    holder, lost = new_session(tenant_a, owner_a, title="holder"), new_session(tenant_a, owner_a)
    brain.acquire(holder.pk)
    send(lost, "work")
    brain.acquire(lost.pk)
    Session.objects.filter(pk=lost.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=5))

    found = brain.claim_within_tenant_limit(lost.pk)
    assert (found.token, found.over_limit) == (None, True)
    lost.refresh_from_db()
    assert lost.runner_token is not None and lost.lease_expires_at <= timezone.now()

    Session.objects.filter(pk=holder.pk).update(runner_token=None, lease_expires_at=None)
    again = brain.claim_within_tenant_limit(lost.pk)
    assert again.token is not None and again.took_over is True


def test_the_sweep_wakes_each_tenant_once_however_many_sessions_wait(
    tenant_a, owner_a, model_config_a, settings, woken
):
    """Issue #26: the safety net looked at each waiting Session's tenant once per Session, so
    one sweep woke a big tenant's free places once for every Session in its queue."""
    presence.beat()
    waiting = [new_session(tenant_a, owner_a, title=f"waiting {n}") for n in range(5)]
    holder = new_session(tenant_a, owner_a, title="holder")
    token = brain.acquire(holder.pk)
    for session in waiting:
        send(session, "queued work")
        assert brain.drive(session.pk) == "queued"
    brain.release(holder.pk, token)
    settings.XAGENT_TENANT_MAX_RUNNING = 2  # two free places, five waiting

    assert brain.recover_stale_sessions() == 2
    assert woken == [s.pk for s in waiting[:2]]
