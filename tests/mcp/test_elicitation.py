"""Elicitation on the real loop: the example MCP server (a real stdio process) asks a question in
the middle of a tool call; it becomes an input request of the Session, answered over the API or
the WebSocket, declined by its timeout or cancelled by an interrupt — and the tool result the
model reads says what the server got. Only the model is scripted."""

import json
import threading
import time
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.utils import timezone

from config.asgi import application
from sessions_app.models import InputRequest, Message, SessionEvent, Turn
from sessions_app.runtime import brain, engine
from tests.factories import example_stdio_fields, issue_key
from tests.runtime.helpers import assert_gap_free, drive_until_idle, new_session, send
from tests.support.model_server import text_reply, tool_call, tool_reply
from tests.support.ws import CONNECT_TIMEOUT_S
from tests.tenancy.isolation import assert_cross_tenant_404, assert_error_shape
from tools_app.mcp.sync import add_server, refresh_server
from tools_app.models import MCPServer

pytestmark = pytest.mark.django_db(transaction=True)
TOOL = "example__ask_preference"
ANSWER = {"name": "Ann", "drink": "tea", "cups": 3, "sugar": True}


@pytest.fixture
def asking_session(tenant_a, owner_a, model_config_a, model_server):
    """A Session whose model calls the eliciting tool once, then answers with text."""
    server = add_server(tenant_a, "example", MCPServer.Transport.STDIO, **example_stdio_fields())
    refresh_server(server)
    session = new_session(tenant_a, owner_a)
    engine.add_selected_capabilities(session.pk, None, tools=[TOOL], added_by="test")
    model_server.script(
        "agent",
        tool_reply([tool_call(TOOL, {"topic": "the meeting"}, id="ask")]),
        text_reply("noted"),
    )
    return session


def when_asked(session, answer, polls=1200):
    """Run `answer(request)` in a thread as soon as the Session has a pending input request
    (the way a person would: from outside the runner). Returns the thread; join it after."""
    seen = {}

    def wait_and_answer():
        try:
            for _ in range(polls):
                request = InputRequest.objects.filter(session=session, status="pending").first()
                if request is not None:
                    seen["request"] = request
                    seen["result"] = answer(request)
                    return
                time.sleep(0.05)
        finally:
            connection.close()

    thread = threading.Thread(target=wait_and_answer, daemon=True)
    thread.start()
    thread.seen = seen
    return thread


def tool_result(session):
    return Message.objects.get(session=session, role="tool", tool_call_id="ask")


def test_an_api_answer_reaches_the_server_and_the_tool_result(asking_session, api_owner_a):
    session = asking_session
    url = f"/api/v1/sessions/{session.pk}/input-requests/"

    def answer(request):
        pending = api_owner_a.get(f"{url}?status=pending").json()["results"]
        assert [row["id"] for row in pending] == [request.pk] and pending[0]["can_answer"]
        return api_owner_a.post(
            f"{url}{request.pk}/answer/", {"action": "accept", "content": ANSWER}, format="json"
        )

    thread = when_asked(session, answer)
    send(session, "ask me what to drink")
    drive_until_idle(session)
    thread.join(timeout=30)

    assert thread.seen["result"].status_code == 200, thread.seen["result"].content
    got = json.loads(tool_result(session).content)
    assert got == {"action": "accept", "content": ANSWER}
    request = InputRequest.objects.get(session=session)
    assert (request.status, request.action, request.content) == ("accepted", "accept", ANSWER)
    assert request.answered_by.username == "owner_a" and request.call_id == "ask"
    asked = SessionEvent.objects.get(session=session, type="input.requested").data
    assert asked["request_id"] == request.pk and asked["server"] == "example" and asked["call_id"] == "ask"
    assert asked["schema"]["properties"]["drink"]["enum"] == ["coffee", "tea", "water"]
    assert asked["schema"]["required"] == ["name", "drink"]
    answered = SessionEvent.objects.get(session=session, type="input.answered").data
    assert answered == {"request_id": request.pk, "action": "accept", "status": "accepted", "by": "owner_a"}
    assert Turn.objects.get(session=session).reason == "completed"
    assert_gap_free(session)
    detail = api_owner_a.get(f"{url}{request.pk}/").json()
    assert detail["status"] == "accepted" and detail["answered_by"] == "owner_a" and not detail["can_answer"]


def test_an_unanswered_request_times_out_and_the_server_gets_decline(asking_session, settings):
    settings.XAGENT_ELICITATION_TIMEOUT_SECONDS = 1
    session = asking_session
    send(session, "ask me what to drink")
    drive_until_idle(session)

    assert json.loads(tool_result(session).content) == {"action": "decline"}
    request = InputRequest.objects.get(session=session)
    assert (request.status, request.action, request.answered_by) == ("expired", "decline", None)
    answered = SessionEvent.objects.get(session=session, type="input.answered").data
    assert answered["action"] == "decline" and answered["by"] == "timeout"


def test_a_decline_from_the_api_is_what_the_server_gets(asking_session, api_owner_a):
    session = asking_session
    url = f"/api/v1/sessions/{session.pk}/input-requests/"
    thread = when_asked(
        session, lambda r: api_owner_a.post(f"{url}{r.pk}/answer/", {"action": "decline"}, format="json")
    )
    send(session, "ask me what to drink")
    drive_until_idle(session)
    thread.join(timeout=30)
    assert json.loads(tool_result(session).content) == {"action": "decline"}
    assert InputRequest.objects.get(session=session).status == "declined"


def test_an_interrupt_while_waiting_cancels_the_request(asking_session, owner_a):
    session = asking_session
    thread = when_asked(session, lambda request: brain.interrupt(session, user=owner_a))
    send(session, "ask me what to drink")
    drive_until_idle(session)
    thread.join(timeout=30)

    assert json.loads(tool_result(session).content) == {"action": "cancel"}
    request = InputRequest.objects.get(session=session)
    assert (request.status, request.action) == ("cancelled", "cancel")
    assert SessionEvent.objects.get(session=session, type="input.answered").data["by"] == "interrupt"
    assert Turn.objects.get(session=session).reason == "aborted"


# --- answering: the owner operation's refusals ---------------------------------------------------------


@pytest.fixture
def pending(tenant_a, owner_a):
    """A pending request as the tool's handler commits it (no runner needed to answer one)."""
    session = new_session(tenant_a, owner_a)
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "cups": {"type": "integer", "minimum": 1, "maximum": 10},
        },
        "required": ["name"],
    }
    return engine.request_input(
        session.pk,
        None,
        call_id="c1",
        server="example",
        tool=TOOL,
        message="Who?",
        schema=schema,
        timeout_seconds=600,
    )


def answer_url(request, request_id=None):
    return f"/api/v1/sessions/{request.session_id}/input-requests/{request_id or request.pk}/answer/"


def test_bad_answers_get_clear_errors_and_the_request_stays_pending(api_owner_a, pending):
    wrong_type = api_owner_a.post(
        answer_url(pending), {"action": "accept", "content": {"name": 5, "cups": "two"}}, format="json"
    )
    details = assert_error_shape(wrong_type, 400, "validation_error")["details"]
    assert set(details["content"]) == {"name", "cups"}
    missing = api_owner_a.post(
        answer_url(pending), {"action": "accept", "content": {"cups": 2}}, format="json"
    )
    assert assert_error_shape(missing, 400, "validation_error")["details"]["content"] == {
        "name": ["This field is required."]
    }
    for body in ({"action": "maybe"}, {}, {"action": "accept", "content": "Ann"}, ["accept"]):
        assert_error_shape(
            api_owner_a.post(answer_url(pending), body, format="json"), 400, "validation_error"
        )
    assert_error_shape(
        api_owner_a.post(answer_url(pending, 10**9), {"action": "decline"}, format="json"), 404
    )
    bad_filter = api_owner_a.get(f"/api/v1/sessions/{pending.session_id}/input-requests/?status=nope")
    assert_error_shape(bad_filter, 400, "validation_error")
    pending.refresh_from_db()
    assert pending.status == "pending" and not SessionEvent.objects.filter(type="input.answered").exists()


def test_answering_twice_or_after_expiry_is_a_conflict(api_owner_a, pending, tenant_a, owner_a):
    ok = api_owner_a.post(
        answer_url(pending), {"action": "accept", "content": {"name": "Ann"}}, format="json"
    )
    assert ok.status_code == 200 and ok.json()["content"] == {"name": "Ann"}
    again = api_owner_a.post(answer_url(pending), {"action": "decline"}, format="json")
    assert_error_shape(again, 409, "already_decided")

    late = engine.request_input(
        pending.session_id,
        None,
        call_id="c2",
        server="example",
        tool=TOOL,
        message="?",
        schema={},
        timeout_seconds=1,
    )
    InputRequest.objects.filter(pk=late.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert_error_shape(
        api_owner_a.post(answer_url(late), {"action": "decline"}, format="json"), 409, "already_decided"
    )
    late.refresh_from_db()
    assert late.status == "expired" and late.answered_by is None
    assert SessionEvent.objects.filter(type="input.answered").count() == 2


def test_who_may_answer_follows_the_approval_deciders(api_member_a, pending):
    # A member sees the tenant's Session but is neither its owner nor an admin.
    listed = api_member_a.get(f"/api/v1/sessions/{pending.session_id}/input-requests/").json()["results"]
    assert [row["can_answer"] for row in listed] == [False]
    refused = api_member_a.post(answer_url(pending), {"action": "decline"}, format="json")
    assert_error_shape(refused, 403, "permission_denied")
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_another_tenant_gets_404_on_every_route(api_outsider_b, pending, tenant_b, outsider_b):
    base = f"/api/v1/sessions/{pending.session_id}/input-requests/"
    assert_cross_tenant_404(api_outsider_b, base, methods=("get",))
    assert_cross_tenant_404(api_outsider_b, f"{base}{pending.pk}/", methods=("get",), hidden=["Who?"])
    assert_cross_tenant_404(
        api_outsider_b, answer_url(pending), methods=("post",), data={"action": "decline"}
    )
    # Through a Session of their own: the other tenant's request id is still not found.
    own = new_session(tenant_b, outsider_b)
    mixed = f"/api/v1/sessions/{own.pk}/input-requests/{pending.pk}/"
    assert_cross_tenant_404(api_outsider_b, mixed, methods=("get",), hidden=["Who?"])
    assert_cross_tenant_404(api_outsider_b, f"{mixed}answer/", methods=("post",), data={"action": "decline"})
    pending.refresh_from_db()
    assert pending.status == "pending"


async def test_the_websocket_answer_input_frame(pending, tenant_a, owner_a, tenant_b, outsider_b):
    key = await database_sync_to_async(lambda: issue_key(tenant_a, owner_a)[1])()
    communicator = WebsocketCommunicator(
        application, f"/ws/sessions/{pending.session_id}/?token={key}&after=999"
    )
    assert (await communicator.connect(timeout=CONNECT_TIMEOUT_S))[0]

    async def reply(frame, wanted):
        await communicator.send_json_to(frame)
        while True:
            received = await communicator.receive_json_from(timeout=5)
            if received["type"] == wanted:
                return received

    error = await reply(
        {"type": "answer_input", "request_id": pending.pk, "action": "accept", "content": {}}, "error"
    )
    assert error["error"]["code"] == "validation_error" and "name" in error["error"]["details"]["content"]
    for frame in (
        {"type": "answer_input"},
        {"type": "answer_input", "request_id": "x", "action": "accept"},
        {"type": "answer_input", "request_id": pending.pk, "action": "accept", "content": [1]},
    ):
        assert (await reply(frame, "error"))["error"]["code"] == "validation_error"
    missing = await reply({"type": "answer_input", "request_id": 10**9, "action": "decline"}, "error")
    assert missing["error"]["code"] == "not_found"
    ack = await reply(
        {"type": "answer_input", "request_id": pending.pk, "action": "accept", "content": {"name": "Bo"}},
        "ack",
    )
    assert ack["data"] == {"request_id": pending.pk, "status": "accepted"}
    again = await reply({"type": "answer_input", "request_id": pending.pk, "action": "cancel"}, "error")
    assert again["error"]["code"] == "already_decided" and again["error"]["request_id"] == pending.pk
    await communicator.disconnect()
    row = await database_sync_to_async(InputRequest.objects.get)(pk=pending.pk)
    assert row.content == {"name": "Bo"} and row.status == "accepted"


async def test_the_websocket_frame_cannot_reach_another_tenants_request(pending, tenant_b, outsider_b):
    own = await database_sync_to_async(lambda: new_session(tenant_b, outsider_b))()
    key = await database_sync_to_async(lambda: issue_key(tenant_b, outsider_b)[1])()
    communicator = WebsocketCommunicator(application, f"/ws/sessions/{own.pk}/?token={key}")
    assert (await communicator.connect(timeout=CONNECT_TIMEOUT_S))[0]
    await communicator.send_json_to({"type": "answer_input", "request_id": pending.pk, "action": "decline"})
    while (frame := await communicator.receive_json_from(timeout=5))["type"] != "error":
        pass
    assert frame["error"]["code"] == "not_found"
    await communicator.disconnect()
    row = await database_sync_to_async(InputRequest.objects.get)(pk=pending.pk)
    assert row.status == "pending"


def test_an_answer_with_nul_characters_is_a_validation_error_not_a_server_error(api_owner_a, pending):
    # PostgreSQL's jsonb refuses "\u0000" (found by QA on the production stack: a 500 from the
    # API and a server_error frame on the WebSocket); the answer must be refused as invalid.
    answer = api_owner_a.post(
        answer_url(pending), {"action": "accept", "content": {"name": "a\u0000b"}}, format="json"
    )
    assert assert_error_shape(answer, 400, "validation_error")["details"]["content"] == {
        "name": ["Must not contain NUL characters."]
    }
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_a_server_asking_with_nul_characters_gets_a_request_not_a_database_error(tenant_a, owner_a):
    # Found by QA on the production stack: a server whose elicitation message held NUL failed
    # the tool call with "DataError: PostgreSQL text fields cannot contain NUL (0x00) bytes".
    session = new_session(tenant_a, owner_a)
    request = engine.request_input(
        session.pk,
        None,
        call_id="c1",
        server="example",
        tool=TOOL,
        message="hello\x00world",
        schema={"type": "object", "properties": {"na\x00me": {"type": "string", "description": "a\x00b"}}},
        timeout_seconds=600,
    )
    request.refresh_from_db()
    assert request.status == "pending" and request.message == "hello\ufffdworld"
    assert request.schema["properties"] == {"na\ufffdme": {"type": "string", "description": "a\ufffdb"}}
