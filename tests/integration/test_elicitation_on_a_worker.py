"""Elicitation on the production path: a Session driven through the REST API and run by a separate
Celery worker over Redis and PostgreSQL; the example MCP server is a real stdio process the worker
starts; the model is the scripted server on loopback. The server's question reaches the Session
as `input.requested` with its schema; an answer from the API (this process, not the worker) or
from the WebSocket reaches the server and the tool result the model reads says what it got; a
worker whose timeout is short declines on its own."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from config.asgi import application
from sessions_app.models import InputRequest, Turn
from sessions_app.runtime import engine
from tests.factories import example_stdio_fields, issue_key
from tests.support.model_server import text_reply, tool_call, tool_reply
from tests.support.ws import CONNECT_TIMEOUT_S
from tools_app.mcp.sync import add_server, refresh_server
from tools_app.models import MCPServer

from .conftest import wait_for
from .processes import database_env_for_workers, running, worker_command

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

TOOL = "example__ask_preference"
ANSWER = {"name": "Ann", "drink": "water", "cups": 1, "sugar": False}


@pytest.fixture
def asking(tenant_a, model_config_a, model_server):
    """start(client) -> a Session whose model calls the eliciting tool once, its input sent."""
    server = add_server(tenant_a, "example", MCPServer.Transport.STDIO, **example_stdio_fields())
    refresh_server(server)

    def start(client) -> str:
        model_server.script(
            "agent", tool_reply([tool_call(TOOL, {"topic": "the review"}, id="ask")]), text_reply("noted")
        )
        session_id = client.post("/api/v1/sessions/", {"title": "drinks"}, format="json").json()["id"]
        engine.add_selected_capabilities(session_id, None, tools=[TOOL], added_by="test")
        sent = client.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": "ask me"}, format="json")
        assert sent.status_code == 202
        return session_id

    return start


def _pending(session_id, worker) -> InputRequest:
    wait_for(lambda: InputRequest.objects.filter(session_id=session_id, status="pending").exists(), worker)
    return InputRequest.objects.get(session_id=session_id)


def _tool_result(client, session_id, worker) -> dict:
    wait_for(lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").exists(), worker)
    assert Turn.objects.get(session_id=session_id).reason == "completed"
    messages = client.get(f"/api/v1/sessions/{session_id}/messages/").json()["results"]
    return json.loads(next(m["content"] for m in messages if m["tool_call_id"] == "ask"))


def test_an_api_answer_reaches_the_server_through_the_worker(asking, api_owner_a, worker):
    session_id = asking(api_owner_a)
    request = _pending(session_id, worker)
    events = api_owner_a.get(f"/api/v1/sessions/{session_id}/events/").json()["events"]
    asked = next(e["data"] for e in events if e["type"] == "input.requested")
    assert asked["request_id"] == request.pk and asked["server"] == "example" and asked["call_id"] == "ask"
    assert set(asked["schema"]["properties"]) == {"name", "drink", "cups", "sugar"}

    answered = api_owner_a.post(
        f"/api/v1/sessions/{session_id}/input-requests/{request.pk}/answer/",
        {"action": "accept", "content": ANSWER},
        format="json",
    )
    assert answered.status_code == 200, answered.content
    assert _tool_result(api_owner_a, session_id, worker) == {"action": "accept", "content": ANSWER}
    events = api_owner_a.get(f"/api/v1/sessions/{session_id}/events/").json()["events"]
    assert [e["data"]["action"] for e in events if e["type"] == "input.answered"] == ["accept"]


def test_a_websocket_answer_reaches_the_server(asking, api_owner_a, tenant_a, owner_a, worker):
    session_id = asking(api_owner_a)
    request = _pending(session_id, worker)
    key = issue_key(tenant_a, owner_a)[1]

    async def answer_over_the_socket():
        communicator = WebsocketCommunicator(
            application, f"/ws/sessions/{session_id}/?token={key}&after=999999"
        )
        assert (await communicator.connect(timeout=CONNECT_TIMEOUT_S))[0]
        await communicator.send_json_to(
            {"type": "answer_input", "request_id": request.pk, "action": "decline"}
        )
        while (frame := await communicator.receive_json_from(timeout=10))["type"] != "ack":
            assert frame["type"] != "error", frame
        await communicator.disconnect()
        return frame

    assert async_to_sync(answer_over_the_socket)()["data"] == {"request_id": request.pk, "status": "declined"}
    assert _tool_result(api_owner_a, session_id, worker) == {"action": "decline"}


def test_a_question_nobody_answers_is_declined_after_the_timeout(asking, api_owner_a, tmp_path):
    env = {**database_env_for_workers(), "XAGENT_ELICITATION_TIMEOUT_SECONDS": "2"}
    log = tmp_path / "worker.log"
    with running(worker_command("elicit-timeout"), env, log) as worker:
        worker.log_path = log
        session_id = asking(api_owner_a)
        assert _tool_result(api_owner_a, session_id, worker) == {"action": "decline"}
    request = InputRequest.objects.get(session_id=session_id)
    assert (request.status, request.action, request.answered_by) == ("expired", "decline", None)
