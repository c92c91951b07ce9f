"""Limits of a runner slice (issue #11 item 5), in-process: a turn whose runner is lost K times in
a row at the same point ends `failed` instead of killing the next worker; a slice past its soft
time limit ends its turn `error` with that reason; a process that shuts down hands its slices
over at the next step boundary. The same rules on real worker processes: tests/integration."""

import json
import threading
import uuid
from datetime import timedelta

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.utils import timezone

from sessions_app.models import Input, Message, RunnerSlice, Session, SessionEvent, Turn
from sessions_app.runtime import brain, engine
from sessions_app.runtime.agent import AgentService
from tests.support.model_server import text_reply

from .helpers import assert_tool_pairs, commit_calls, drive_until_idle, new_session, send

ATTEMPTS = 3


@pytest.fixture(autouse=True)
def poison_attempts(settings):
    settings.XAGENT_POISON_SLICE_ATTEMPTS = ATTEMPTS


def _slice(session, outcome: str, ended_at=None, token=None) -> RunnerSlice:
    now = timezone.now()
    return RunnerSlice.objects.create(
        tenant_id=session.tenant_id,
        session=session,
        token=token or uuid.uuid4(),
        worker="test",
        started_at=now,
        ended_at=ended_at if ended_at is not None else (now if outcome else None),
        outcome=outcome,
    )


def _turn_with_a_dangling_call(session, earlier=()):
    """A turn whose runner committed a tool call and then died (its slice never ended), after
    earlier slices of the turn that ended with the outcomes `earlier`."""
    send(session, "run the long job")
    token = brain.acquire(session.pk)
    turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    commit_calls(session, token, turn, [{"id": "c1", "name": "fs_list", "arguments": json.dumps({})}])
    for outcome in earlier:
        _slice(session, outcome)
    _slice(session, "", token=token)
    Session.objects.filter(pk=session.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    return turn


def test_a_turn_whose_runner_is_lost_k_times_in_a_row_ends_failed_and_keeps_queued_input(
    tenant_a, owner_a, model_config_a, model_server
):
    session = new_session(tenant_a, owner_a)
    # Earlier takers-over died at the same point, and so did the last one.
    turn = _turn_with_a_dangling_call(session, earlier=["lost"] * (ATTEMPTS - 1))
    later = send(session, "and then this")
    model_server.script("agent", text_reply("Done with the second request."))

    drive_until_idle(session)

    turn.refresh_from_db()
    assert turn.reason == "error"
    assert turn.reason_detail == (
        f"the runner was lost {ATTEMPTS} times in a row at this point; stopped to protect the workers"
    )
    error = SessionEvent.objects.get(session=session, type="error")
    assert error.data == {"code": "poisoned_slice", "message": turn.reason_detail}
    failed = SessionEvent.objects.filter(session=session, type="session.status", data__status="failed")
    assert [e.data["reason"] for e in failed] == [turn.reason_detail]
    # The dangling call is answered (history stays valid) and was never run again.
    closed = Message.objects.get(session=session, role="tool", tool_call_id="c1")
    assert closed.is_error and closed.content.startswith("Interrupted:")
    assert_tool_pairs(session)
    # Nothing of the poisoned turn reached the model again; the queued message ran as its own turn.
    assert len(model_server.requests_for("agent")) == 1
    assert Input.objects.get(pk=later.pk).status == "consumed"
    assert Turn.objects.get(session=session, number=2).reason == "completed"
    assert RunnerSlice.objects.filter(session=session, outcome="lost").count() == ATTEMPTS


def test_fewer_losses_in_a_row_than_the_limit_let_the_turn_go_on(
    tenant_a, owner_a, model_config_a, model_server
):
    session = new_session(tenant_a, owner_a)
    # A slice ended normally between the losses: the count starts again after it.
    turn = _turn_with_a_dangling_call(session, earlier=["lost", "released", "lost"])
    model_server.script("agent", text_reply("The listing was interrupted; carrying on."))

    drive_until_idle(session)

    turn.refresh_from_db()
    assert turn.reason == "completed"
    assert not SessionEvent.objects.filter(session=session, type="error").exists()


def test_losses_before_the_turn_began_do_not_count(tenant_a, owner_a, model_config_a, model_server):
    session = new_session(tenant_a, owner_a)
    long_ago = timezone.now() - timedelta(hours=1)
    for _ in range(ATTEMPTS):
        _slice(session, "lost", ended_at=long_ago)
    turn = _turn_with_a_dangling_call(session)
    model_server.script("agent", text_reply("Carrying on."))

    drive_until_idle(session)

    turn.refresh_from_db()
    assert turn.reason == "completed"


def test_a_slice_past_its_soft_time_limit_ends_the_turn_with_that_reason(
    tenant_a, owner_a, model_config_a, model_server, monkeypatch, settings
):
    settings.XAGENT_SLICE_SOFT_TIME_LIMIT = 900
    session = new_session(tenant_a, owner_a)
    send(session, "a step that never ends")

    def overrun(self):
        raise SoftTimeLimitExceeded()  # what the prefork pool raises in the task at the soft limit

    monkeypatch.setattr(AgentService, "step", overrun)
    later = send(session, "queued meanwhile")

    assert brain.drive(session.pk) == "error"

    session.refresh_from_db()
    turn = Turn.objects.get(session=session, number=1)
    assert turn.reason == "error"
    assert turn.reason_detail.startswith("the slice exceeded its time limit (900 s")
    assert (session.status, session.status_reason) == ("failed", turn.reason_detail)
    assert session.runner_token is None  # the lease is released
    assert Input.objects.get(pk=later.pk).status == "queued"  # kept for the next runner


def test_a_process_shutting_down_hands_its_slices_over_at_the_next_boundary(
    tenant_a, owner_a, model_config_a, model_server, monkeypatch
):
    session = new_session(tenant_a, owner_a)
    message = send(session, "hello")
    woken = []
    monkeypatch.setattr(brain, "_handing_over", threading.Event())
    monkeypatch.setattr(brain, "wake", woken.append)
    brain.hand_over_slices()

    assert brain.drive(session.pk) == "yielded"

    session.refresh_from_db()
    assert session.runner_token is None
    assert Input.objects.get(pk=message.pk).status == "queued"
    assert woken == [session.pk]  # re-enqueued for another worker
    assert not model_server.requests_for("agent")
