"""The goal driver on the production path: a run started through the REST API, its rounds run by a
separate Celery worker over Redis and PostgreSQL, the scripted model on loopback. Every round
leaves a plan task open, so the driver continues until the round limit stops the run."""

from __future__ import annotations

import pytest

from sessions_app.models import GoalRun, Session, Turn
from tests.runtime.helpers import assert_gap_free, assert_tool_pairs
from tests.support.model_server import text_reply, tool_call, tool_reply

from .conftest import wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def test_a_goal_run_stops_at_its_round_limit_on_a_worker(api_owner_a, model_config_a, model_server, worker):
    model_server.script(
        "agent",
        tool_reply(tool_call("plan_create", {"title": "Guide", "tasks": ["outline", "write"]}, id="plan")),
        text_reply("Outlined."),
        text_reply("Wrote half of it."),
        text_reply("Wrote more of it."),
    )
    session_id = api_owner_a.post("/api/v1/sessions/", {"title": "goal"}, format="json").json()["id"]
    url = f"/api/v1/sessions/{session_id}/goal-run/"

    started = api_owner_a.post(
        url, {"goal": "Write guide.md about Markdown tables", "max_rounds": 3}, format="json"
    )
    assert started.status_code == 201, started.content

    wait_for(lambda: not GoalRun.objects.get(pk=started.json()["id"]).is_open, worker)
    run = api_owner_a.get(url).json()
    assert (run["status"], run["rounds_done"]) == ("stopped", 3)
    assert run["last_decision"] == {
        "decision": "stop",
        "reason": "round limit reached (3 rounds), the agent never said the goal was complete",
        "round": 3,
    }
    assert run["tokens_used"] > 0
    events = api_owner_a.get(f"/api/v1/sessions/{session_id}/events/").json()["events"]
    decided = [e["data"] for e in events if e["type"] == "goal.decided"]
    assert [(d["round"], d["decision"]) for d in decided] == [(1, "continue"), (2, "continue"), (3, "stop")]
    assert [t.reason for t in Turn.objects.filter(session_id=session_id).order_by("number")] == [
        "completed"
    ] * 3
    assert len(model_server.requests_for("agent")) == 4
    session = Session.objects.get(pk=session_id)
    assert session.status == "idle"
    assert_gap_free(session)
    assert_tool_pairs(session)
