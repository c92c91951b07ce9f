"""OAuth MCP servers on the real stack: the admin connects in this (web) process, a separate
Celery worker runs the Session's tool calls over Redis and PostgreSQL. The grant is shared
through the database: the worker refreshes the expired token and stores it; a consent
withdrawn on the server's side ends the worker's call with the error naming who can fix it."""

import pytest

from sessions_app.models import Message, Turn
from sessions_app.runtime import engine
from tests.mcp import test_oauth as oauth
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.mcp.oauth import authorization_status

from .conftest import wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]
# The OAuth-protected test server of tests/mcp/test_oauth.py (a process per module, reset per test).
oauth_process = oauth.oauth_process
oauth_server = oauth.oauth_server


def ask(api, session_id, model_server, call_id, text):
    model_server.script(
        "agent", tool_reply([tool_call("secured__echo", {"text": text}, id=call_id)]), text_reply("done")
    )
    turns = Turn.objects.filter(session_id=session_id).exclude(reason="").count()
    assert (
        api.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": text}, format="json").status_code == 202
    )
    return turns + 1


def test_a_worker_refreshes_the_token_and_reports_a_lost_consent(
    tenant_a, owner_a, api_owner_a, model_config_a, model_server, worker, oauth_server
):
    server = oauth.oauth_mcp_server(tenant_a, oauth_server.url)
    server.save(by_operator=True)  # the worker has no loopback allow-list of its own
    oauth.connect_through_the_callback(oauth.admin_browser(owner_a), server, oauth_server)
    before = oauth.stored_tokens(server)
    oauth.wait_for_expiry(server)
    session_id = api_owner_a.post("/api/v1/sessions/", {"title": "oauth"}, format="json").json()["id"]
    engine.add_selected_capabilities(session_id, None, tools=["secured__echo"], added_by="test")

    done = ask(api_owner_a, session_id, model_server, "first", "from the worker")
    wait_for(lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").count() == done, worker)

    first = Message.objects.get(session_id=session_id, tool_call_id="first")
    assert not first.is_error and first.content == "echo: from the worker"
    assert oauth.stored_tokens(server)["access_token"] != before["access_token"]
    assert oauth_server.stats()["refresh_grants"] == 1

    oauth_server.revoke_all()
    done = ask(api_owner_a, session_id, model_server, "second", "again")
    wait_for(lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").count() == done, worker)

    second = Message.objects.get(session_id=session_id, tool_call_id="second")
    assert second.is_error and "needs an admin of this tenant to connect it" in second.content
    assert "did not answer within" not in second.content
    assert authorization_status(server) == "needs_consent"
