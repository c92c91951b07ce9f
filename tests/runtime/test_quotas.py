"""Quotas (issue #28): checked before every model call; a spent one parks the Session `queued`
with reason `quota_exceeded` (event `quota.exceeded`), keeps its turn and inputs, and lets it go
on when the limit is raised or a new period begins. Driven in-process against the scripted
model server through the real openai client (the worker version: tests/integration/
test_quota_on_a_worker.py)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app.models import Input, ModelCall, Quota, SessionEvent
from sessions_app.runtime import brain
from tests.support.model_server import text_reply, tool_call, tool_reply

from .helpers import drive_until_idle, new_session, send

pytestmark = pytest.mark.django_db(transaction=True)

PER_CALL = {"prompt_tokens": 900, "completion_tokens": 100}  # 1,000 tokens a call


def three_calls(model_server):
    """A turn of three model calls (two tool steps and the answer), 1,000 tokens each."""
    model_server.script(
        "agent",
        tool_reply(tool_call("fs_list", {}), usage=PER_CALL),
        tool_reply(tool_call("fs_list", {}), usage=PER_CALL),
        text_reply("All listed.", usage=PER_CALL),
    )


def quota_events(session) -> list[dict]:
    return list(
        SessionEvent.objects.filter(session=session, type="quota.exceeded").values_list("data", flat=True)
    )


def agent_calls(session) -> int:
    return ModelCall.objects.filter(session=session, purpose="agent").count()


def test_a_spent_quota_parks_the_session_before_its_next_call_and_a_raise_resumes_it(
    tenant_a, owner_a, model_config_a, model_server, api_owner_a
):
    quota = Quota.objects.create(tenant=tenant_a, period="day", max_tokens=1500)
    session = new_session(tenant_a, owner_a)
    three_calls(model_server)
    send(session, "list the workspace twice")
    outcomes = drive_until_idle(session)

    # 1,000 used before the second call (under 1,500): it runs; 2,000 before the third: parked.
    assert outcomes[-1] == "quota_exceeded"
    assert (session.status, session.status_reason) == ("queued", "quota_exceeded")
    assert agent_calls(session) == 2 and session.current_turn_id is not None
    [event] = quota_events(session)
    assert {k: event[k] for k in ("scope", "limit", "period", "used", "unit")} == {
        "scope": "tenant",
        "limit": 1500,
        "period": "day",
        "used": 2000,
        "unit": "tokens",
    }
    assert "admin" in event["raised_by"]

    # A message sent meanwhile is accepted and kept, and the answer says why it waits.
    response = api_owner_a.post(
        f"/api/v1/sessions/{session.pk}/inputs/", {"text": "and then?"}, format="json"
    )
    assert response.status_code == 202
    assert response.json() == {
        "input_id": response.json()["input_id"],
        "status": "queued",
        "reason": "quota_exceeded",
    }
    # Woken by that input, the Session looks again and parks again: nothing runs, nothing is lost.
    drive_until_idle(session)
    assert agent_calls(session) == 2 and session.status_reason == "quota_exceeded"
    assert Input.objects.get(pk=response.json()["input_id"]).status == "queued"

    quota.max_tokens = 100_000
    quota.save()  # raising the limit wakes the parked Sessions (after commit)
    model_server.script("agent", text_reply("Then this.", usage=PER_CALL))
    drive_until_idle(session)
    assert session.status == "idle" and agent_calls(session) == 4  # the turn's last call, the next turn's
    assert Input.objects.get(pk=response.json()["input_id"]).status == "consumed"


def test_a_new_period_resumes_parked_sessions_from_the_sweep(tenant_a, owner_a, model_config_a, model_server):
    Quota.objects.create(tenant=tenant_a, period="day", max_tokens=1000)
    session = new_session(tenant_a, owner_a)
    three_calls(model_server)
    send(session, "go")
    drive_until_idle(session)
    assert session.status_reason == "quota_exceeded" and agent_calls(session) == 1

    # Still today: the recovery sweep leaves it parked.
    assert brain.recover_stale_sessions() == 0
    # The day is over (the calls are yesterday's now): the sweep lets it go on.
    ModelCall.objects.filter(session=session).update(started_at=session.created_at - timedelta(days=1))
    assert brain.recover_stale_sessions() == 1
    drive_until_idle(session)
    # The new day's 1,000 tokens allow one more call, and the Session parks again before the next.
    assert agent_calls(session) == 2 and session.status_reason == "quota_exceeded"
    assert len(quota_events(session)) == 2


def test_a_members_quota_stops_only_their_sessions(tenant_a, owner_a, member_a, model_config_a, model_server):
    Quota.objects.create(tenant=tenant_a, user=member_a, period="month", max_tokens=500)
    theirs, mine = new_session(tenant_a, member_a), new_session(tenant_a, owner_a)
    model_server.default("agent", lambda request: text_reply("ok", usage=PER_CALL))
    send(theirs, "first")
    drive_until_idle(theirs)
    assert theirs.status == "idle"  # nothing used yet when the call started
    send(theirs, "second")
    drive_until_idle(theirs)
    assert theirs.status_reason == "quota_exceeded" and quota_events(theirs)[0]["scope"] == "user"
    send(mine, "mine")
    drive_until_idle(mine)
    assert mine.status == "idle" and agent_calls(mine) == 1


def test_a_cost_limit_counts_the_priced_calls(tenant_a, owner_a, model_config_a, model_server):
    model_config_a.input_price, model_config_a.output_price = Decimal("10"), Decimal("10")
    model_config_a.save()
    Quota.objects.create(tenant=tenant_a, period="month", max_cost=Decimal("0.015"))
    session = new_session(tenant_a, owner_a)
    three_calls(model_server)  # 1,000 tokens at 10 per million: 0.01 a call
    send(session, "go")
    drive_until_idle(session)
    assert agent_calls(session) == 2
    [event] = quota_events(session)
    assert event["unit"] == "cost" and event["limit"] == 0.015 and event["used"] == pytest.approx(0.02)


def test_a_step_checks_only_where_a_quota_applies(tenant_a, owner_a, member_a, model_config_a, model_server):
    """No quota for this Session's owner (none at all, then only another member's): its steps
    run no usage query."""
    model_server.default("agent", lambda request: text_reply("ok", usage=PER_CALL))

    def usage_queries(session) -> int:
        with CaptureQueriesContext(connection) as captured:
            send(session, "go")
            drive_until_idle(session)
        assert session.status == "idle"
        return sum(
            1
            for q in captured.captured_queries
            if "SUM(" in q["sql"] and "sessions_app_modelcall" in q["sql"]
        )

    assert usage_queries(new_session(tenant_a, owner_a)) == 0
    Quota.objects.create(tenant=tenant_a, user=member_a, period="day", max_tokens=10)
    assert usage_queries(new_session(tenant_a, owner_a)) == 0
    Quota.objects.create(tenant=tenant_a, period="day", max_tokens=10**9)
    assert usage_queries(new_session(tenant_a, owner_a)) == 1  # one model call, one check


def test_a_sub_sessions_turn_is_not_prepared_on_a_spent_quota_and_is_prepared_when_raised(
    tenant_a, owner_a, model_config_a, model_server
):
    """The outer loop's calls (task understanding, orchestration) are model calls too."""
    from tests.runtime.test_task_understanding import relation

    main = new_session(tenant_a, owner_a, title="coordinator")
    sub = new_session(tenant_a, owner_a, title="research", kind="sub", parent=main)
    ModelCall.objects.create(  # the day's usage so far: the limit is reached
        tenant=tenant_a, session=main, purpose="agent", provider="openai", model="m", prompt_tokens=5000
    )
    quota = Quota.objects.create(tenant=tenant_a, period="day", max_tokens=5000)
    send(sub, "Research ComfyUI.")
    drive_until_idle(sub)
    assert (sub.status, sub.status_reason) == ("queued", "quota_exceeded")
    assert not ModelCall.objects.filter(session=sub).exists()  # not even the understanding call

    model_server.script("task_relation", relation("new_task"))
    model_server.default(
        "orchestrate", lambda request: text_reply('{"skills": [], "toolsets": [], "tools": []}')
    )
    model_server.script("agent", text_reply("Researched."))
    quota.max_tokens = 10**6
    quota.save()
    drive_until_idle(sub)
    assert sub.status == "idle"
    purposes = list(ModelCall.objects.filter(session=sub).order_by("id").values_list("purpose", flat=True))
    assert purposes[0] == "task_relation" and purposes[-1] == "agent"
