"""Issue #13, deliverable 5: the goal driver, in-process on the real runtime (Brain, SessionEngine,
AgentService, ToolService), the model replaced only by the scripted server.

A goal run is rounds of ordinary message inputs; after each round's turn the driver reads the
product's facts (end reason, token counters, clock, delivery record, plan) and records continue /
done / stop as `goal.decided`. It pauses after any recovery until a person resumes it, and never
bypasses an approval."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals_app.models import ApprovalPolicy, ApprovalRule, PendingApproval
from sessions_app.models import GoalRun, Input, PlanTask, Session, SessionEvent, Turn
from sessions_app.runtime import brain, engine, goal_driver
from tests.api.test_schema import assert_matches
from tests.support.model_server import text_reply, tool_call, tool_reply
from tests.tenancy.isolation import assert_cross_tenant_404, assert_error_shape, assert_requires_auth

from .helpers import assert_gap_free, assert_tool_pairs, drive_until_idle, new_session

GOAL = "Write report.md: a short report on the Q3 tickets, with a summary and a table."
PLAN = tool_reply(tool_call("plan_create", {"title": "Report", "tasks": ["draft", "check"]}, id="plan"))
NEVER_CLAIMED = "the agent never said the goal was complete"
NOT_CLAIMED = "the agent has not said the goal is complete"
AGREE = "and the product's records agree: every check passed, no unresolved failure, no open plan task, no sub-Session working"


def claim(status="complete", reason="report.md is written", id="goal"):
    """The agent's update_goal call, as the scripted model sends it."""
    return tool_reply(tool_call("update_goal", {"status": status, "reason": reason}, id=id))


def done_reason(round_number, reason="report.md is written"):
    return f"round {round_number}: the agent said the goal is complete ({reason}), {AGREE}"


@pytest.fixture
def session(tenant_a, owner_a, model_config_a):
    return new_session(tenant_a, owner_a, title="Acme goal")


def _start(session, user, **limits):
    values = {"max_rounds": 3, "token_budget": 1_000_000, "wall_clock_seconds": 3600, **limits}
    return goal_driver.start(session.pk, goal=GOAL, user=user, **values)


def _events(session, type_):
    return [e.data for e in SessionEvent.objects.filter(session=session, type=type_).order_by("seq")]


def _decisions(session):
    return [(d["round"], d["decision"], d["reason"]) for d in _events(session, "goal.decided")]


def _rounds(session):
    """The round inputs the driver queued, in order: (round, status)."""
    return [
        (i.payload["round"], i.status)
        for i in Input.objects.filter(session=session, payload__has_key="goal_run_id").order_by("id")
    ]


def _lose_runner(session):
    """The worker dies holding the lease; the lease lapses (as in tests/runtime/test_recovery.py)."""
    Session.objects.filter(pk=session.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def _json_round_trip(session):
    for event in SessionEvent.objects.filter(session=session, type__startswith="goal."):
        assert json.loads(json.dumps(event.as_dict())) == event.as_dict()


# --- the decisions ---------------------------------------------------------------------------------


def test_a_three_round_task_stops_at_its_round_limit_with_the_reason_recorded(session, owner_a, model_server):
    model_server.script(
        "agent",
        tool_reply(
            [PLAN.tool_calls[0], tool_call("fs_read", {"path": "tickets.csv"}, id="read")]
        ),  # round 1: a plan, and a read that fails (no such file)
        text_reply("Drafted the outline."),
        text_reply("Worked on the draft."),  # round 2: the plan's tasks stay open
        text_reply("Still drafting."),  # round 3
    )
    run = _start(session, owner_a)

    drive_until_idle(session)

    run.refresh_from_db()
    assert (run.status, run.rounds_done, run.last_decision) == ("stopped", 3, "stop")
    assert run.last_reason == f"round limit reached (3 rounds), {NEVER_CLAIMED}" and run.ended_at is not None
    assert [(r, d) for r, d, _ in _decisions(session)] == [(1, "continue"), (2, "continue"), (3, "stop")]
    assert _decisions(session)[-1][2] == f"round limit reached (3 rounds), {NEVER_CLAIMED}"
    assert _decisions(session)[0][2] == (
        f"round 2 of 3 queued: {NOT_CLAIMED}; the records show 1 unresolved failure, 2 open plan tasks"
    )
    turns = list(Turn.objects.filter(session=session).order_by("number"))
    assert [t.reason for t in turns] == ["completed"] * 3
    assert _rounds(session) == [(1, "consumed"), (2, "consumed"), (3, "consumed")]
    # Each later round tells the model what the product recorded, not what the model claimed.
    requests = model_server.requests_for("agent")
    assert len(requests) == 4
    round_2 = requests[2].messages[-1]["content"]
    assert round_2.startswith("Goal run, round 2 of 3.") and GOAL in round_2
    assert "You did not say the goal is complete (update_goal)." in round_2
    assert "- unresolved failure: fs_read (call read)" in round_2
    assert "- open plan task t1 (pending): draft" in round_2
    round_3 = requests[3].messages[-1]["content"]
    assert "round 3 of 3" in round_3 and "unresolved failure" not in round_3
    # The run's goal is the person's: the goals are it, not the framed text of round 1.
    session.refresh_from_db()
    assert (session.session_goal, session.phase_goal) == (GOAL, GOAL)
    assert f"Current phase goal: {GOAL}" in requests[0].messages[0]["content"]
    decided = _events(session, "goal.decided")[-1]
    assert decided == {
        "goal_run_id": run.pk,
        "round": 3,
        "decision": "stop",
        "reason": f"round limit reached (3 rounds), {NEVER_CLAIMED}",
        "tokens_used": run.tokens_used,
        "elapsed_seconds": decided["elapsed_seconds"],
        "claim": None,
    }
    assert run.tokens_used > 0 and isinstance(decided["elapsed_seconds"], int)
    assert_gap_free(session)
    assert_tool_pairs(session)
    _json_round_trip(session)


def test_it_stops_when_the_token_budget_is_spent(session, owner_a, model_server):
    usage = {"prompt_tokens": 80, "completion_tokens": 40}
    model_server.script("agent", PLAN, text_reply("Outline drafted.", usage=usage))
    run = _start(session, owner_a, token_budget=100)

    drive_until_idle(session)

    run.refresh_from_db()
    spent = session.prompt_tokens + session.completion_tokens
    assert spent >= 120 and run.tokens_used == spent
    assert run.status == "stopped" and run.rounds_done == 1
    assert _decisions(session) == [(1, "stop", f"token budget spent ({spent} of 100)")]
    assert _rounds(session) == [(1, "consumed")]  # no second round
    assert len(model_server.requests_for("agent")) == 2


def test_it_stops_when_the_wall_clock_budget_is_spent(session, owner_a, model_server):
    model_server.script("agent", PLAN, text_reply("Outline drafted."))
    run = _start(session, owner_a, wall_clock_seconds=600)
    # The run started long ago (a row, not a sleep: no test here waits on the clock).
    GoalRun.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(hours=1))

    drive_until_idle(session)

    run.refresh_from_db()
    assert run.status == "stopped"
    ((round_number, decision, reason),) = _decisions(session)
    assert (round_number, decision) == (1, "stop") and reason.startswith("wall-clock budget spent (")
    assert reason.endswith(" s of 600 s)")


def test_a_clean_delivery_with_the_plan_done_ends_the_run_done(session, owner_a, model_server):
    model_server.script(
        "agent",
        PLAN,
        text_reply("Outline drafted; the check comes next."),  # round 1: both tasks still open
        tool_reply(tool_call("fs_write", {"path": "report.md", "content": "# Q3\n\nAll good.\n"}, id="w")),
        tool_reply(
            tool_call(
                "plan_update",
                {"updates": [{"id": "t1", "status": "done"}, {"id": "t2", "status": "done"}]},
                id="u",
            )
        ),
        claim(),  # round 2: the agent says it is complete, and the records agree
        text_reply("report.md is written."),
    )
    run = _start(session, owner_a, max_rounds=5)

    drive_until_idle(session)

    run.refresh_from_db()
    assert (run.status, run.rounds_done) == ("done", 2)
    assert _decisions(session) == [
        (1, "continue", f"round 2 of 5 queued: {NOT_CLAIMED}; the records show 2 open plan tasks"),
        (2, "done", done_reason(2)),
    ]
    assert _events(session, "goal.decided")[-1]["claim"] == {
        "status": "complete",
        "reason": "report.md is written",
    }
    assert Turn.objects.filter(session=session).count() == 2


def test_a_round_the_user_interrupts_stops_the_run(session, owner_a, model_server):
    model_server.default("agent", lambda request: tool_reply([tool_call("fs_list", {})]))
    run = _start(session, owner_a)
    assert brain.drive(session.pk, max_steps=2) == "yielded"  # round 1 is running

    brain.interrupt(session, user=owner_a)
    drive_until_idle(session)

    run.refresh_from_db()
    assert run.status == "stopped" and run.rounds_done == 1
    assert _decisions(session) == [(1, "stop", "round 1 ended aborted: interrupted by the user")]
    assert Turn.objects.get(session=session).reason == "aborted"
    assert _rounds(session) == [(1, "consumed")]


def test_a_round_that_ends_in_error_stops_the_run(session, owner_a, model_server):
    from tests.support.model_server import error_reply

    model_server.script("agent", error_reply(400, "bad request", times=5))
    run = _start(session, owner_a)

    drive_until_idle(session)

    run.refresh_from_db()
    ((round_number, decision, reason),) = _decisions(session)
    assert run.status == "stopped" and (round_number, decision) == (1, "stop")
    assert reason.startswith("round 1 ended error")


def test_another_message_between_rounds_is_not_a_round(session, owner_a, model_server):
    model_server.script(
        "agent",
        PLAN,
        text_reply("Round one."),
        text_reply("Answering the question."),  # the person's own message, queued meanwhile
        text_reply("Round two."),
    )
    run = _start(session, owner_a, max_rounds=2)
    brain.submit_input(session, kind="message", text="By the way: which quarter?", user=owner_a)

    drive_until_idle(session)

    run.refresh_from_db()
    assert [t.reason for t in Turn.objects.filter(session=session)] == ["completed"] * 3
    assert _decisions(session) == [
        (1, "continue", f"round 2 of 2 queued: {NOT_CLAIMED}; the records show 2 open plan tasks"),
        (2, "stop", f"round limit reached (2 rounds), {NEVER_CLAIMED}"),
    ]


# --- approvals are never bypassed --------------------------------------------------------------------


def test_a_round_parked_on_an_approval_gets_no_decision_until_it_is_decided(
    session, tenant_a, owner_a, model_server
):
    policy = ApprovalPolicy.objects.create(tenant=tenant_a, name="careful", priority=1)
    ApprovalRule.objects.create(tenant=tenant_a, policy=policy, tool_glob="fs_write", reason="ask first")
    model_server.script(
        "agent",
        tool_reply(tool_call("fs_write", {"path": "report.md", "content": "# Q3\n"}, id="w")),
    )
    run = _start(session, owner_a)

    drive_until_idle(session)

    session.refresh_from_db()
    run.refresh_from_db()
    assert session.status == "waiting_approval"
    assert (run.status, run.rounds_done, run.last_decision) == ("active", 0, "")
    assert _decisions(session) == []
    assert not (engine.workspace_path(session) / "report.md").exists()
    assert _rounds(session) == [(1, "consumed")]  # nothing queued past the parked round

    model_server.script("agent", claim(), text_reply("report.md is written."))
    brain.submit_decision(PendingApproval.objects.get(session_id=session.pk), "approve", user=owner_a)
    drive_until_idle(session)

    run.refresh_from_db()
    assert (engine.workspace_path(session) / "report.md").read_text() == "# Q3\n"
    assert run.status == "done"
    assert [d for _, d, _ in _decisions(session)] == ["done"]
    types = [
        t
        for t in SessionEvent.objects.filter(session=session).order_by("seq").values_list("type", flat=True)
        if t in ("approval.decided", "turn.ended", "goal.decided")
    ]
    assert types == ["approval.decided", "turn.ended", "goal.decided"]


# --- recovery: off until a person resumes it --------------------------------------------------------


def test_no_auto_resume_after_a_crash_mid_round_until_a_person_resumes(
    session, owner_a, api_owner_a, model_server
):
    model_server.script("agent", PLAN, text_reply("Round one, finished by the runner that took over."))
    run = _start(session, owner_a, max_rounds=2)
    token = brain.acquire(session.pk)  # a worker starts round 1 ...
    engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    _lose_runner(session)  # ... and dies

    drive_until_idle(session)  # the next runner takes over: the turn goes on (auto-continue)

    run.refresh_from_db()
    assert run.status == "paused" and run.paused_reason == goal_driver.RECOVERY_PAUSE
    assert run.rounds_done == 1  # the round in flight ended normally and was counted
    assert _events(session, "goal.paused") == [{"goal_run_id": run.pk, "reason": goal_driver.RECOVERY_PAUSE}]
    assert _decisions(session) == []  # nothing decided, nothing queued by itself
    assert _rounds(session) == [(1, "consumed")]
    assert Turn.objects.get(session=session).reason == "completed"
    assert not engine.queued_inputs(session.pk).exists()
    shown = api_owner_a.get(f"/api/v1/sessions/{session.pk}/goal-run/").json()
    assert (shown["status"], shown["paused_reason"], shown["last_decision"]) == (
        "paused",
        goal_driver.RECOVERY_PAUSE,
        None,
    )

    model_server.script("agent", text_reply("Round two."))
    resumed = api_owner_a.post(f"/api/v1/sessions/{session.pk}/goal-run/resume/")
    assert resumed.status_code == 200 and resumed.json()["status"] == "active"
    assert _events(session, "goal.resumed") == [{"goal_run_id": run.pk, "by": "owner_a"}]
    assert _decisions(session) == [
        (1, "continue", f"round 2 of 2 queued: {NOT_CLAIMED}; the records show 2 open plan tasks")
    ]
    drive_until_idle(session)

    run.refresh_from_db()
    assert run.status == "stopped" and run.last_reason == f"round limit reached (2 rounds), {NEVER_CLAIMED}"
    assert _rounds(session) == [(1, "consumed"), (2, "consumed")]
    assert_gap_free(session)


def test_a_round_queued_when_the_runner_was_lost_is_withdrawn_until_resumed(session, owner_a, model_server):
    run = _start(session, owner_a, max_rounds=1)
    brain.acquire(session.pk)  # a worker took the Session and died before starting round 1
    _lose_runner(session)

    drive_until_idle(session)

    run.refresh_from_db()
    round_1 = Input.objects.get(pk=run.round_input_id)
    assert run.status == "paused" and round_1.status == "consumed" and round_1.turn_id is None
    assert _events(session, "goal.paused") == [
        {"goal_run_id": run.pk, "reason": goal_driver.RECOVERY_PAUSE, "withdrawn_input_id": round_1.pk}
    ]
    assert not Turn.objects.filter(session=session).exists()
    assert model_server.requests_for("agent") == []

    model_server.script("agent", claim(), text_reply("Done."))
    goal_driver.resume(session.pk, user=owner_a)
    drive_until_idle(session)

    run.refresh_from_db()
    assert _rounds(session) == [(1, "consumed"), (1, "consumed")]  # round 1 again, in a new input
    again = Input.objects.filter(session=session, payload__has_key="goal_run_id").order_by("-id").first()
    assert "round 0" not in again.payload["text"]  # no round had ended before it
    assert Turn.objects.get(session=session).reason == "completed"
    assert run.status == "done" and run.rounds_done == 1


def test_resuming_after_the_last_round_stops_at_the_limit(session, owner_a, model_server):
    model_server.script("agent", PLAN, text_reply("The only round."))
    run = _start(session, owner_a, max_rounds=1)
    token = brain.acquire(session.pk)
    engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    _lose_runner(session)
    drive_until_idle(session)
    run.refresh_from_db()
    assert (run.status, run.rounds_done) == ("paused", 1)

    goal_driver.resume(session.pk, user=owner_a)

    run.refresh_from_db()
    assert run.status == "stopped" and _decisions(session) == [
        (1, "stop", f"round limit reached (1 rounds), {NEVER_CLAIMED}")
    ]
    assert not engine.queued_inputs(session.pk).exists()


def test_with_auto_continue_off_the_lost_round_ends_interrupted_and_resume_goes_on(
    session, tenant_a, owner_a, model_server
):
    tenant_a.auto_resume_after_recovery = False
    tenant_a.save()
    run = _start(session, owner_a, max_rounds=2)
    token = brain.acquire(session.pk)
    engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    _lose_runner(session)

    drive_until_idle(session)

    run.refresh_from_db()
    assert Turn.objects.get(session=session).reason == "interrupted"
    assert (run.status, run.rounds_done) == ("paused", 1) and _decisions(session) == []

    model_server.script("agent", claim(reason="round two is complete"), text_reply("Round two, complete."))
    goal_driver.resume(session.pk, user=owner_a)  # a person chose to go on: the lost round does not stop it
    drive_until_idle(session)

    run.refresh_from_db()
    assert _decisions(session) == [
        (1, "continue", f"round 2 of 2 queued: {NOT_CLAIMED}; the records show no delivery record"),
        (2, "done", done_reason(2, "round two is complete")),
    ]
    assert run.status == "done"


def test_every_round_is_the_request_of_the_person_who_started_the_run(
    session, member_a, owner_a, model_server
):
    from sessions_app.models import Memory

    Memory.objects.create(
        tenant=session.tenant, user=owner_a, kind="preference", text="Q3 ticket reports end with a table."
    )
    model_server.script("agent", PLAN, text_reply("One."), text_reply("Two."))
    run = _start(session, member_a, max_rounds=2)  # a colleague's run in owner_a's Session

    drive_until_idle(session)

    authors = list(
        Input.objects.filter(session=session, payload__has_key="goal_run_id").values_list(
            "created_by__username", flat=True
        )
    )
    assert authors == ["member_a", "member_a"]
    assert all(not turn.recalled_memory_ids for turn in Turn.objects.filter(session=session))
    assert GoalRun.objects.get(pk=run.pk).created_by == member_a


def test_the_messages_api_names_the_run_and_round_of_a_round_message(
    session, member_a, api_owner_a, model_server, schema
):
    model_server.script("agent", PLAN, text_reply("One."), text_reply("Two."))
    run = _start(session, member_a, max_rounds=2)
    drive_until_idle(session)
    api_owner_a.post(f"/api/v1/sessions/{session.pk}/inputs/", {"text": "Thanks."}, format="json")
    model_server.script("agent", text_reply("You are welcome."))
    drive_until_idle(session)

    page = api_owner_a.get(f"/api/v1/sessions/{session.pk}/messages/").json()

    users = [
        (m["author"], m["goal_round"], m["content"].split("\n")[0])
        for m in page["results"]
        if m["role"] == "user"
    ]
    assert users == [
        ("member_a", {"goal_run_id": run.pk, "round": 1}, "Goal run, round 1 of 2."),
        ("member_a", {"goal_run_id": run.pk, "round": 2}, "Goal run, round 2 of 2."),
        ("owner_a", None, "Thanks."),
    ]
    assert {m["goal_round"] for m in page["results"] if m["role"] != "user"} == {None}
    assert_matches(schema, "/api/v1/sessions/{id}/messages/", "get", 200, page)


def test_a_paused_run_is_not_woken_by_the_sweep(session, owner_a, model_server):
    run = _start(session, owner_a)
    brain.acquire(session.pk)
    _lose_runner(session)
    drive_until_idle(session)
    assert GoalRun.objects.get(pk=run.pk).status == "paused"

    assert brain.recover_stale_sessions() == 0  # nothing of it is work for a runner


# --- the REST API --------------------------------------------------------------------------------------


@pytest.fixture
def schema(api_anonymous, db):
    return api_anonymous.get("/api/v1/schema/?format=json").json()


def _url(session, suffix=""):
    return f"/api/v1/sessions/{session.pk}/goal-run/{suffix}"


def test_a_person_starts_reads_and_stops_a_run_through_the_api(session, api_owner_a, owner_a, schema):
    assert_error_shape(api_owner_a.get(_url(session)), 404, "not_found")

    created = api_owner_a.post(_url(session), {"goal": GOAL, "max_rounds": 2}, format="json")

    assert created.status_code == 201, created.content
    body = created.json()
    run = GoalRun.objects.get(session=session)
    assert body == {
        "id": run.pk,
        "goal": GOAL,
        "status": "active",
        "max_rounds": 2,
        "rounds_done": 0,
        "token_budget": 200_000,
        "tokens_used": 0,
        "wall_clock_seconds": 3600,
        "elapsed_seconds": body["elapsed_seconds"],
        "started_at": body["started_at"],
        "ended_at": None,
        "last_decision": None,
        "paused_reason": "",
    }
    assert run.created_by == owner_a
    round_1 = Input.objects.get(pk=run.round_input_id)
    assert round_1.kind == "message" and round_1.created_by == owner_a
    assert round_1.payload == {
        "text": round_1.payload["text"],
        "goal_run_id": run.pk,
        "round": 1,
        "goal": GOAL,
    }
    assert _events(session, "goal.started") == [
        {
            "goal_run_id": run.pk,
            "goal": GOAL,
            "max_rounds": 2,
            "token_budget": 200_000,
            "wall_clock_seconds": 3600,
            "by": "owner_a",
        }
    ]
    assert_matches(schema, "/api/v1/sessions/{id}/goal-run/", "post", 201, body)
    read = api_owner_a.get(_url(session))
    assert read.status_code == 200 and read.json()["id"] == run.pk
    assert_matches(schema, "/api/v1/sessions/{id}/goal-run/", "get", 200, read.json())

    again = api_owner_a.post(_url(session), {"goal": "another"}, format="json")
    assert_error_shape(again, 409, "goal_run_active")
    assert_matches(schema, "/api/v1/sessions/{id}/goal-run/", "post", 409, again.json())

    stopped = api_owner_a.post(_url(session, "stop/"))
    assert stopped.status_code == 200
    assert stopped.json()["status"] == "stopped" and stopped.json()["last_decision"] == {
        "decision": "stop",
        "reason": "stopped by owner_a",
        "round": 0,
    }
    assert_matches(schema, "/api/v1/sessions/{id}/goal-run/stop/", "post", 200, stopped.json())
    assert Input.objects.get(pk=round_1.pk).status == "consumed"  # the round not started is withdrawn
    assert not engine.queued_inputs(session.pk).exists()
    assert api_owner_a.post(_url(session, "stop/")).json() == stopped.json()  # already stopped
    finished = api_owner_a.post(_url(session, "resume/"))
    assert_error_shape(finished, 409, "goal_run_finished")
    assert_matches(schema, "/api/v1/sessions/{id}/goal-run/resume/", "post", 409, finished.json())

    # Finished: a new run may start, and the route shows the newest.
    assert api_owner_a.post(_url(session), {"goal": "next"}, format="json").status_code == 201
    assert api_owner_a.get(_url(session)).json()["goal"] == "next"


def test_a_done_run_cannot_be_stopped_or_resumed(session, api_owner_a, owner_a, model_server):
    model_server.script("agent", claim(), text_reply("Done at once."))
    _start(session, owner_a)
    drive_until_idle(session)
    assert api_owner_a.get(_url(session)).json()["status"] == "done"

    assert_error_shape(api_owner_a.post(_url(session, "stop/")), 409, "goal_run_finished")
    assert_error_shape(api_owner_a.post(_url(session, "resume/")), 409, "goal_run_finished")


def test_resuming_an_active_run_changes_nothing(session, api_owner_a, owner_a):
    run = _start(session, owner_a)
    response = api_owner_a.post(_url(session, "resume/"))
    assert response.status_code == 200 and response.json()["status"] == "active"
    assert _events(session, "goal.resumed") == [] and _rounds(session) == [(1, "queued")]
    assert GoalRun.objects.get().pk == run.pk


def test_resume_and_stop_without_a_run_are_404(session, api_owner_a):
    for suffix in ("", "resume/", "stop/"):
        method = api_owner_a.get if suffix == "" else api_owner_a.post
        assert_error_shape(method(_url(session, suffix)), 404, "not_found")


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "goal"),
        ({"goal": ""}, "goal"),
        ({"goal": "   \n"}, "goal"),
        ({"goal": "x" * 10_001}, "goal"),
        ({"goal": None}, "goal"),
        ({"goal": ["a"]}, "goal"),
        ({"goal": GOAL, "max_rounds": 0}, "max_rounds"),
        ({"goal": GOAL, "max_rounds": 51}, "max_rounds"),
        ({"goal": GOAL, "max_rounds": "three"}, "max_rounds"),
        ({"goal": GOAL, "max_rounds": True}, "max_rounds"),
        ({"goal": GOAL, "max_rounds": 2.5}, "max_rounds"),
        ({"goal": GOAL, "token_budget": 0}, "token_budget"),
        ({"goal": GOAL, "token_budget": -5}, "token_budget"),
        ({"goal": GOAL, "token_budget": 2**64}, "token_budget"),
        ({"goal": GOAL, "wall_clock_seconds": 0}, "wall_clock_seconds"),
        ({"goal": GOAL, "wall_clock_seconds": 86_401}, "wall_clock_seconds"),
    ],
)
def test_a_bad_body_is_a_400_naming_the_field(session, api_owner_a, schema, body, field):
    response = api_owner_a.post(_url(session), body, format="json")

    error = assert_error_shape(response, 400, "validation_error")
    assert list(error["details"]) == [field]
    assert_matches(schema, "/api/v1/sessions/{id}/goal-run/", "post", 400, response.json())
    assert not GoalRun.objects.exists() and not Input.objects.exists()


def test_a_body_that_is_not_json_is_a_400(session, api_owner_a):
    response = api_owner_a.post(_url(session), "{not json", content_type="application/json")
    assert_error_shape(response, 400, "malformed_body")
    assert not GoalRun.objects.exists()


def test_the_limits_at_their_bounds_are_accepted(session, api_owner_a):
    body = {"goal": "g", "max_rounds": 50, "token_budget": 1, "wall_clock_seconds": 86_400}
    response = api_owner_a.post(_url(session), body, format="json")
    assert response.status_code == 201
    assert {k: response.json()[k] for k in body} == body


@pytest.fixture
def run_of_a(session, owner_a):
    return _start(session, owner_a)


def test_another_tenant_gets_404_on_every_goal_run_route(session, run_of_a, api_outsider_b):
    assert_cross_tenant_404(
        api_outsider_b, _url(session), methods=("get", "post"), data={"goal": "mine now"}, hidden=[GOAL]
    )
    for suffix in ("resume/", "stop/"):
        assert_cross_tenant_404(api_outsider_b, _url(session, suffix), methods=("post",), hidden=[GOAL])
    run_of_a.refresh_from_db()
    assert run_of_a.status == "active" and GoalRun.objects.count() == 1
    assert _rounds(session) == [(1, "queued")]


def test_the_goal_run_routes_require_auth(session, run_of_a, api_anonymous):
    assert_requires_auth(api_anonymous, _url(session), methods=("get", "post"), data={"goal": "x"})
    for suffix in ("resume/", "stop/"):
        assert_requires_auth(api_anonymous, _url(session, suffix), methods=("post",))


def test_a_malformed_or_unknown_session_id_is_a_404(api_owner_a, db):
    for sid in ("not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        assert_error_shape(api_owner_a.get(f"/api/v1/sessions/{sid}/goal-run/"), 404, "not_found")
        assert_error_shape(api_owner_a.post(f"/api/v1/sessions/{sid}/goal-run/stop/"), 404, "not_found")


def test_an_archived_session_takes_no_goal_run(session, api_owner_a, owner_a):
    assert api_owner_a.delete(f"/api/v1/sessions/{session.pk}/").status_code == 204
    assert_error_shape(api_owner_a.post(_url(session), {"goal": GOAL}, format="json"), 404, "not_found")
    with pytest.raises(goal_driver.GoalRunError) as refused:
        _start(session, owner_a)
    assert refused.value.code == "session_archived"


# --- admin -----------------------------------------------------------------------------------------------


def test_the_admin_shows_a_tenants_goal_runs_read_only(session, run_of_a, owner_a, tenant_b, outsider_b):
    other = goal_driver.start(
        new_session(tenant_b, outsider_b).pk,
        goal="Bravo's own goal",
        max_rounds=1,
        token_budget=10,
        wall_clock_seconds=10,
        user=outsider_b,
    )
    client = Client()
    client.force_login(owner_a)  # tenant A's admin (staff, not a superuser)

    listing = client.get("/admin/sessions_app/goalrun/")
    assert listing.status_code == 200
    assert list(listing.context["cl"].result_list) == [run_of_a]
    assert client.get(f"/admin/sessions_app/goalrun/{other.pk}/change/").status_code in (302, 404)
    assert client.get("/admin/sessions_app/goalrun/add/").status_code == 403
    page = client.post(f"/admin/sessions_app/goalrun/{run_of_a.pk}/change/", {"status": "done"})
    assert page.status_code == 403
    assert GoalRun.objects.get(pk=run_of_a.pk).status == "active"


# --- with the outer loop ----------------------------------------------------------------------------


def test_a_goal_run_in_a_sub_session_is_understood_from_the_goal_once(
    tenant_a, owner_a, model_config_a, model_server
):
    import json as json_module

    from tests.support.model_server import json_reply

    main = new_session(tenant_a, owner_a, title="coordinator")
    sub = new_session(tenant_a, owner_a, title="sub", kind="sub", parent=main)
    model_server.script(
        "task_relation",
        json_reply(
            {
                "task_relation": "new_task",
                "skill_recall_terms": [],
                "tool_recall_terms": [],
                "memory_recall_terms": [],
            }
        ),
    )
    model_server.script("agent", PLAN, text_reply("Drafted."), text_reply("Still drafting."))
    _start(sub, owner_a, max_rounds=2)
    drive_until_idle(sub)
    # Round 1 was understood from the person's goal; round 2 continued without a second call.
    (understanding,) = model_server.requests_for("task_relation")
    assert json_module.loads(understanding.messages[1]["content"])["message"] == GOAL
    sub.refresh_from_db()
    assert (sub.session_goal, sub.phase_goal) == (GOAL, GOAL)
    assert [d for _, d, _ in _decisions(sub)] == ["continue", "stop"]


def test_a_plan_left_from_an_earlier_task_does_not_keep_a_run_from_being_done(session, owner_a, model_server):
    model_server.script("agent", PLAN, text_reply("planned, not done"))
    engine.enqueue_input(session.pk, kind="message", payload={"text": "an earlier task"})
    drive_until_idle(session)
    assert PlanTask.objects.filter(plan__session=session, status="pending").count() == 2
    model_server.script("agent", claim(), text_reply("All written."))
    run = _start(session, owner_a)
    drive_until_idle(session)
    run.refresh_from_db()
    assert (run.status, run.rounds_done) == ("done", 1)


def test_a_goal_must_be_a_string(session, api_owner_a):
    for goal in (123, 1.5, True):
        response = api_owner_a.post(_url(session), {"goal": goal}, format="json")
        assert_error_shape(response, 400, "validation_error")
    assert not GoalRun.objects.exists()


# --- the agent's claim (update_goal), checked against the records -------------------------------------


def test_a_round_of_words_only_is_never_done_and_ends_at_the_round_limit(session, owner_a, model_server):
    """ "Write guide.md …" answered in words only, three times, claiming the work: no claim, no file,
    so the run goes on and stops at its limit, never done."""
    model_server.default("agent", lambda request: text_reply("I wrote guide.md about Markdown tables."))
    run = goal_driver.start(
        session.pk,
        goal="Write guide.md about Markdown tables",
        max_rounds=3,
        token_budget=1_000_000,
        wall_clock_seconds=3600,
        user=owner_a,
    )

    drive_until_idle(session)

    run.refresh_from_db()
    assert (run.status, run.rounds_done) == ("stopped", 3)
    assert [d for _, d, _ in _decisions(session)] == ["continue", "continue", "stop"]
    assert run.last_reason == f"round limit reached (3 rounds), {NEVER_CLAIMED}"
    assert not (engine.workspace_path(session) / "guide.md").exists()


def test_write_then_claim_complete_is_done_after_round_one(session, owner_a, model_server):
    model_server.script(
        "agent",
        tool_reply(tool_call("fs_write", {"path": "report.md", "content": "# Q3\n\n| a | b |\n"}, id="w")),
        claim(),
        text_reply("report.md is written: a summary and a table."),
    )
    run = _start(session, owner_a)

    drive_until_idle(session)

    run.refresh_from_db()
    assert (run.status, run.rounds_done) == ("done", 1)
    assert _decisions(session) == [(1, "done", done_reason(1))]
    requests = model_server.requests_for("agent")
    # Offered in the round; the claim's result (committed) comes before the closing answer's call.
    assert "update_goal" in requests[0].tool_names
    assert json.loads(requests[2].messages[-1]["content"])["status"] == "complete"
    assert_tool_pairs(session)


def test_claim_blocked_stops_the_run_with_the_agents_reason(session, owner_a, model_server):
    reason = "tickets.csv is not in the workspace; I need it uploaded"
    model_server.script("agent", claim("blocked", reason), text_reply("I cannot go on without tickets.csv."))
    run = _start(session, owner_a)

    drive_until_idle(session)

    run.refresh_from_db()
    assert (run.status, run.last_decision) == ("stopped", "stop")
    assert run.last_reason == f"round 1: the agent said it is blocked: {reason}"
    shown = _events(session, "goal.decided")[-1]
    assert shown["claim"] == {"status": "blocked", "reason": reason}
    assert _rounds(session) == [(1, "consumed")]


def test_claim_complete_over_an_unresolved_failure_goes_on_and_names_it(session, owner_a, model_server):
    model_server.script(
        "agent",
        tool_reply(tool_call("fs_read", {"path": "tickets.csv"}, id="read")),  # fails: no such file
        claim(reason="the report is done"),
        text_reply("Done."),
        claim(id="goal-2", reason="now really done"),  # round 2: nothing open any more
        text_reply("Done, checked."),
    )
    run = _start(session, owner_a)

    drive_until_idle(session)

    run.refresh_from_db()
    decisions = _decisions(session)
    assert decisions[0] == (
        1,
        "continue",
        "round 2 of 3 queued: the agent said the goal is complete, but the product's records show "
        "1 unresolved failure",
    )
    round_2 = model_server.requests_for("agent")[3].messages[-1]["content"]
    assert (
        "You said the goal is complete (the report is done), but these records disagree with it." in round_2
    )
    assert "- unresolved failure: fs_read (call read)" in round_2
    assert decisions[1] == (2, "done", done_reason(2, "now really done"))
    assert run.status == "done"


def test_update_goal_is_offered_only_in_a_goal_runs_rounds(session, owner_a, model_server):
    model_server.script(
        "agent",
        claim(),  # the model tries it anyway, outside a goal run
        text_reply("Hello."),
    )
    brain.submit_input(session, kind="message", text="hi", user=owner_a)

    drive_until_idle(session)

    first, second = model_server.requests_for("agent")
    assert "update_goal" not in first.tool_names
    result = second.messages[-1]
    assert result["role"] == "tool" and "update_goal" in result["content"]
    assert not GoalRun.objects.filter(session=session).exists()
    assert Turn.objects.get(session=session).reason == "completed"


def test_a_crash_between_the_claim_and_the_closing_answer_leaves_a_consistent_run(
    session, owner_a, model_server
):
    model_server.script(
        "agent",
        tool_reply(tool_call("fs_write", {"path": "report.md", "content": "# Q3\n"}, id="w")),
        claim(),
        text_reply("report.md is written."),  # the closing answer, by the runner that takes over
    )
    run = _start(session, owner_a)
    assert brain.drive(session.pk, max_steps=2) == "yielded"  # the write, then the claim, committed
    brain.acquire(session.pk)  # the next worker takes the Session ...
    _lose_runner(session)  # ... and dies before the closing answer

    drive_until_idle(session)  # recovery: the run pauses; the round's turn finishes (auto-continue)

    run.refresh_from_db()
    assert (run.status, run.rounds_done, run.paused_reason) == ("paused", 1, goal_driver.RECOVERY_PAUSE)
    assert _decisions(session) == []  # nothing decided behind a person's back
    assert Turn.objects.get(session=session).reason == "completed"
    assert Input.objects.filter(session=session).count() == 1  # no round queued by itself

    goal_driver.resume(session.pk, user=owner_a)  # the committed claim is still the round's

    run.refresh_from_db()
    assert run.status == "done" and _decisions(session) == [(1, "done", done_reason(1))]
    assert_gap_free(session)
    assert_tool_pairs(session)
