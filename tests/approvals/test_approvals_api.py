"""Approvals over REST and the WebSocket `decide` frame: one owner operation, tenant-isolated."""

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from approvals_app.models import PendingApproval
from config.asgi import application
from sessions_app.runtime import engine
from tests.factories import issue_key
from tests.runtime.helpers import drive_until_idle, new_session, send
from tests.support.model_server import text_reply, tool_call, tool_reply
from tests.support.ws import CONNECT_TIMEOUT_S
from tests.tenancy.isolation import assert_cross_tenant_404, assert_error_shape
from tools_app.models import Tool, ToolSet

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def approval(tenant_a, owner_a, model_config_a, model_server):
    cleanup = ToolSet.objects.create(tenant=tenant_a, name="cleanup", is_default=True)
    cleanup.tools.add(Tool.objects.get(tenant=None, name="fs_delete_files"))
    session = new_session(tenant_a, owner_a, title="Acme cleanup")
    (engine.workspace_path(session) / "draft.md").write_text("x")
    model_server.script(
        "agent",
        tool_reply([tool_call("fs_delete_files", {"paths": ["draft.md"]}, id="del")]),
        text_reply("ok"),
    )
    send(session, "delete draft.md")
    drive_until_idle(session)
    return PendingApproval.objects.get(session_id=session.pk)


def test_list_retrieve_and_decide(api_owner_a, approval):
    listed = api_owner_a.get("/api/v1/approvals/?status=pending").json()["results"]
    assert [a["id"] for a in listed] == [approval.pk]
    detail = api_owner_a.get(f"/api/v1/approvals/{approval.pk}/").json()
    assert detail["tool"] == "fs_delete_files" and detail["arguments"] == {"paths": ["draft.md"]}
    assert (
        detail["risk"] == "destructive"
        and detail["status"] == "pending"
        and detail["session"] == str(approval.session_id)
    )
    decided = api_owner_a.post(
        f"/api/v1/approvals/{approval.pk}/decide/", {"decision": "approve"}, format="json"
    )
    assert decided.status_code == 200 and decided.json()["decided_by"] == "owner_a"
    again = api_owner_a.post(
        f"/api/v1/approvals/{approval.pk}/decide/", {"decision": "reject"}, format="json"
    )
    assert_error_shape(again, 409, "already_decided")
    assert api_owner_a.get("/api/v1/approvals/?status=pending").json()["results"] == []
    per_session = api_owner_a.get(f"/api/v1/sessions/{approval.session_id}/approvals/").json()["results"]
    assert [a["status"] for a in per_session] == ["approved"]


def test_bad_decisions_get_clear_errors(api_owner_a, approval):
    bad = api_owner_a.post(f"/api/v1/approvals/{approval.pk}/decide/", {"decision": "maybe"}, format="json")
    assert_error_shape(bad, 400, "validation_error")
    assert_error_shape(api_owner_a.get("/api/v1/approvals/?status=nope"), 400, "validation_error")
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_a_member_who_may_not_see_it_cannot_decide_it(api_member_a, approval):
    # Not their Session and not a decider: the approval is not visible, so it is not found.
    response = api_member_a.post(
        f"/api/v1/approvals/{approval.pk}/decide/", {"decision": "approve"}, format="json"
    )
    assert_error_shape(response, 404, "not_found")
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_another_tenant_gets_404_everywhere(api_outsider_b, approval):
    assert_cross_tenant_404(api_outsider_b, f"/api/v1/approvals/{approval.pk}/", methods=("get",))
    response = api_outsider_b.post(
        f"/api/v1/approvals/{approval.pk}/decide/", {"decision": "approve"}, format="json"
    )
    assert_error_shape(response, 404, "not_found")
    assert_cross_tenant_404(
        api_outsider_b, f"/api/v1/sessions/{approval.session_id}/approvals/", methods=("get",)
    )
    assert api_outsider_b.get("/api/v1/approvals/").json()["results"] == []
    approval.refresh_from_db()
    assert approval.status == "pending"


async def test_the_websocket_decide_frame_uses_the_same_operation(
    approval, tenant_a, owner_a, tenant_b, outsider_b
):
    outsider_key = await database_sync_to_async(lambda: issue_key(tenant_b, outsider_b)[1])()
    outsider = WebsocketCommunicator(application, f"/ws/sessions/{approval.session_id}/?token={outsider_key}")
    assert not (await outsider.connect(timeout=CONNECT_TIMEOUT_S))[0]

    key = await database_sync_to_async(lambda: issue_key(tenant_a, owner_a)[1])()
    from sessions_app.models import Session

    last = (await database_sync_to_async(Session.objects.get)(pk=approval.session_id)).last_event_seq
    communicator = WebsocketCommunicator(
        application, f"/ws/sessions/{approval.session_id}/?token={key}&after={last}"
    )
    assert (await communicator.connect(timeout=CONNECT_TIMEOUT_S))[0]
    await communicator.send_json_to(
        {"type": "decide", "approval_id": approval.pk, "decision": "reject", "comment": "no"}
    )
    frames = [await communicator.receive_json_from(timeout=5) for _ in range(3)]
    ack = next(f for f in frames if f["type"] == "ack")
    assert ack["data"] == {"approval_id": approval.pk, "status": "rejected"}
    await communicator.send_json_to({"type": "decide", "approval_id": approval.pk, "decision": "approve"})
    error = await communicator.receive_json_from(timeout=5)
    while error["type"] != "error":
        error = await communicator.receive_json_from(timeout=5)
    assert error["error"]["code"] == "already_decided"
    await communicator.disconnect()
    refreshed = await database_sync_to_async(PendingApproval.objects.get)(pk=approval.pk)
    assert refreshed.status == "rejected" and refreshed.comment == "no"
