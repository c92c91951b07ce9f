"""SCENARIOS S2 on the real stack: a destructive call waits for approval across a full restart
(web and worker stopped, Redis flushed), then runs exactly once — or is rejected and the model
reads the rejection as that call's result."""

import os
import time

import httpx2 as httpx
import pytest
import redis

from approvals_app.models import PendingApproval
from sessions_app.models import Message, Session, SessionEvent, Turn
from sessions_app.runtime import engine
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.models import Tool, ToolSet

from .processes import web_and_worker

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]
DRAFT = "draft_to_delete.md"


def _wait(predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def _start_waiting_session(tmp_path, api_owner_a, tenant_a, model_server) -> tuple[str, PendingApproval]:
    cleanup = ToolSet.objects.create(tenant=tenant_a, name="cleanup", is_default=True)
    cleanup.tools.add(Tool.objects.get(tenant=None, name="fs_delete_files"))
    model_server.script(
        "agent",
        tool_reply([tool_call("fs_delete_files", {"paths": [DRAFT]}, id="del")]),
        text_reply("Handled the draft."),
    )
    key = api_owner_a.api_key
    with (
        web_and_worker(tmp_path, "1") as stack,
        httpx.Client(
            base_url=f"http://{stack}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as api,
    ):
        session_id = api.post("/sessions/", json={"title": "S2"}).json()["id"]
        (engine.workspace_path(Session.objects.get(pk=session_id)) / DRAFT).write_text("scratch notes")
        api.post(f"/sessions/{session_id}/inputs/", json={"text": "delete draft_to_delete.md"})
        _wait(lambda: Session.objects.get(pk=session_id).status == "waiting_approval")
        pending = api.get("/approvals/", params={"status": "pending"}).json()["results"]
        assert [a["tool"] for a in pending] == ["fs_delete_files"]
    # Everything is down now; Redis forgets every queued message too.
    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()
    return session_id, PendingApproval.objects.get(session_id=session_id)


def test_an_approval_survives_a_full_restart_and_the_call_runs_once(
    tmp_path, api_owner_a, tenant_a, model_config_a, model_server
):
    session_id, approval = _start_waiting_session(tmp_path, api_owner_a, tenant_a, model_server)
    key = api_owner_a.api_key
    with (
        web_and_worker(tmp_path, "2") as stack,
        httpx.Client(
            base_url=f"http://{stack}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as api,
    ):
        time.sleep(1.0)  # give recovery sweeps the chance to (wrongly) move it; asserted by state below
        session = api.get(f"/sessions/{session_id}/").json()
        assert session["status"] == "waiting_approval"
        again = api.get(f"/sessions/{session_id}/approvals/", params={"status": "pending"}).json()["results"]
        assert [a["id"] for a in again] == [approval.pk]

        decided = api.post(f"/approvals/{approval.pk}/decide/", json={"decision": "approve", "comment": "go"})
        assert decided.status_code == 200 and decided.json()["status"] == "approved"
        assert api.post(f"/approvals/{approval.pk}/decide/", json={"decision": "reject"}).status_code == 409
        _wait(lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").exists())

    assert Turn.objects.get(session_id=session_id).reason == "completed"
    assert not (engine.workspace_path(Session.objects.get(pk=session_id)) / DRAFT).exists()
    assert Message.objects.filter(session_id=session_id, role="tool", tool_call_id="del").count() == 1
    assert (
        SessionEvent.objects.filter(session_id=session_id, type="file.changed", data__op="deleted").count()
        == 1
    )
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.executed_at is not None


def test_a_rejection_after_restart_reaches_the_model_as_the_same_calls_result(
    tmp_path, api_owner_a, tenant_a, model_config_a, model_server
):
    session_id, approval = _start_waiting_session(tmp_path, api_owner_a, tenant_a, model_server)
    key = api_owner_a.api_key
    with (
        web_and_worker(tmp_path, "2") as stack,
        httpx.Client(
            base_url=f"http://{stack}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as api,
    ):
        api.post(f"/approvals/{approval.pk}/decide/", json={"decision": "reject", "comment": "keep it"})
        _wait(lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").exists())

    assert (engine.workspace_path(Session.objects.get(pk=session_id)) / DRAFT).read_text() == "scratch notes"
    last_request = model_server.requests_for("agent")[-1]
    tool_message = last_request.messages[-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "del"
    assert "rejected" in tool_message["content"] and "keep it" in tool_message["content"]
    assert Turn.objects.get(session_id=session_id).reason == "completed"
