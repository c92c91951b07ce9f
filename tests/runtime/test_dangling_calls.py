"""A runner lost between a tool call and its result (worker killed): the next slice answers the
dangling call `interrupted`, never runs it again, and the next request is valid."""

import json
from datetime import timedelta

from django.utils import timezone

from sessions_app.models import Message, Session, SessionEvent, Turn
from sessions_app.runtime import brain, engine
from tests.support.model_server import text_reply

from .helpers import assert_tool_pairs, commit_calls, drive_until_idle, new_session, send, writer_for


def test_a_call_left_without_a_result_is_closed_interrupted_and_not_rerun(
    tenant_a, owner_a, model_config_a, model_server
):
    session = new_session(tenant_a, owner_a)
    send(session, "write a.txt and b.txt")
    token = brain.acquire(session.pk)
    turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    calls = [
        {"id": "c1", "name": "fs_write", "arguments": json.dumps({"path": "a.txt", "content": "a"})},
        {
            "id": "c2",
            "name": "fs_edit",  # not idempotent: never run again after a lost runner
            "arguments": json.dumps({"path": "a.txt", "old_text": "a", "new_text": "b"}),
        },
    ]
    commit_calls(session, token, turn, calls)
    engine.commit_tool_result(
        writer_for(session, token),
        turn.pk,
        call_id="c1",
        tool="fs_write",
        content="created a.txt",
        ok=True,
        summary="ok",
    )
    (engine.workspace_path(session) / "a.txt").write_text("a")
    # The worker dies here: c2 has no result, and its lease lapses (never released).
    Session.objects.filter(pk=session.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    model_server.script("agent", text_reply("The edit may not have happened; I will check first."))

    drive_until_idle(session)

    assert Turn.objects.get(pk=turn.pk).reason == "completed"
    assert_tool_pairs(session)
    closed = Message.objects.get(session=session, role="tool", tool_call_id="c2")
    assert closed.is_error and closed.content.startswith("Interrupted:")
    assert (engine.workspace_path(session) / "a.txt").read_text() == "a"  # never run again
    request = model_server.requests_for("agent")[-1]
    assert [(m["role"], m.get("tool_call_id")) for m in request.messages[-3:]] == [
        ("assistant", None),
        ("tool", "c1"),
        ("tool", "c2"),
    ]
    recovered = SessionEvent.objects.get(session=session, type="session.recovered")
    assert recovered.data["interrupted_calls"] == [
        {"call_id": "c2", "tool": "fs_edit", "reason": "runner lost before its result"}
    ]


def test_a_turn_parked_on_an_approval_keeps_its_waiting_call(tenant_a, owner_a):
    session = new_session(tenant_a, owner_a)
    send(session, "x")
    token = brain.acquire(session.pk)
    turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    commit_calls(session, token, turn, [{"id": "c9", "name": "fs_delete_files", "arguments": "{}"}])
    with engine.locked_session(session.pk, token) as locked:
        engine.set_status(locked, "waiting_approval")

    recovery = engine.recover_lost_runner(session.pk, token, rerun_kind=lambda name: "idempotent")
    assert recovery.interrupted_calls == [] and recovery.rerun_calls == []
    assert recovery.next == "the turn stays waiting for approval"  # no approval row in this set-up
    assert not Message.objects.filter(session=session, role="tool").exists()
    assert Session.objects.get(pk=session.pk).status == "waiting_approval"


def test_a_model_call_in_flight_when_the_runner_was_lost_is_ended_and_asked_again(
    tenant_a, owner_a, model_config_a, model_server
):
    from sessions_app.models import ModelCall, RunnerSlice
    from sessions_app.runtime.agent import AgentService

    session = new_session(tenant_a, owner_a)
    send(session, "say hi")
    token = brain.acquire(session.pk)
    RunnerSlice.objects.create(tenant=tenant_a, session=session, token=token, started_at=timezone.now())
    turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    agent = AgentService(session.pk, token)
    agent.prepare(turn.pk)
    lost = engine.begin_model_call(agent.context.writer, turn.pk, agent.context.request())
    # The worker dies while the model answers: the call never ends, the lease lapses.
    Session.objects.filter(pk=session.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    model_server.script("agent", text_reply("hi"))

    drive_until_idle(session)

    lost.refresh_from_db()
    assert (
        lost.finish_reason == "interrupted" and lost.ended_at is not None and "runner was lost" in lost.error
    )
    assert ModelCall.objects.filter(session=session).exclude(pk=lost.pk).get().finish_reason == "stop"
    assert Turn.objects.get(pk=turn.pk).reason == "completed"
    recovered = SessionEvent.objects.get(session=session, type="session.recovered")
    assert (
        recovered.data["interrupted_model_calls"] == [lost.pk] and recovered.data["interrupted_calls"] == []
    )
    assert RunnerSlice.objects.get(token=token).outcome == "lost"
