"""OAuth 2.1 per MCP server, end to end against a real OAuth-protected MCP server process on
loopback (tests/support/oauth_mcp_server.py, the SDK's server-side auth helpers).

The admin connects through our callback route: the Django test client plays the admin's
browser on our side, and a plain HTTP client follows the authorization server's redirect on
its side. Sessions run the tool through the real runtime with the scripted model server.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx2
import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from sessions_app.models import Message, SessionEvent
from tenancy_app.crypto import decrypt
from tenancy_app.models import AuditEntry
from tests.integration.processes import free_port, running
from tests.mcp.test_mcp import wait_until_accepting
from tests.runtime.helpers import drive_until_idle, new_session, send
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.base import ToolContext, ToolError
from tools_app.mcp.client import AuthorizationRequired, connection_for, list_tools
from tools_app.mcp.oauth import authorization_status, set_client_secret
from tools_app.mcp.sync import add_server, refresh_server, save_server
from tools_app.mcp.tool import MCPTool
from tools_app.models import MCPOAuthAttempt, MCPOAuthGrant, MCPServer, Tool

pytestmark = pytest.mark.django_db(transaction=True)
SERVER = ["-m", "tests.support.oauth_mcp_server"]
TOKEN_SECONDS = 6
CC_ID, CC_SECRET = "machine-client", "cc-secret-value-123"


@dataclass
class OAuthServer:
    base: str
    port: int

    @property
    def url(self) -> str:
        return f"{self.base}/mcp"

    def stats(self) -> dict:
        return httpx2.get(f"{self.base}/test/stats").json()

    def revoke_all(self) -> None:
        httpx2.post(f"{self.base}/test/revoke-all").raise_for_status()


def _serve(tmp_path_factory, *extra):
    import sys

    port = free_port()
    log_path = tmp_path_factory.mktemp("oauth") / "oauth_server.log"
    command = [sys.executable, *SERVER, "--port", str(port), *extra]
    with running(command, dict(os.environ), log_path) as proc:
        wait_until_accepting(port, proc, log_path)
        yield OAuthServer(base=f"http://127.0.0.1:{port}", port=port)


@pytest.fixture(scope="module")
def oauth_process(tmp_path_factory):
    yield from _serve(tmp_path_factory, "--token-seconds", str(TOKEN_SECONDS))


@pytest.fixture(scope="module")
def cc_process(tmp_path_factory):
    yield from _serve(tmp_path_factory, "--client-credentials", f"{CC_ID}:{CC_SECRET}")


def _fresh(process: OAuthServer, settings) -> OAuthServer:
    httpx2.post(f"{process.base}/test/reset").raise_for_status()
    # Tenant-configured servers reach loopback only because the operator lists it.
    settings.XAGENT_OUTBOUND_ALLOWED_HOSTS = [f"127.0.0.1:{process.port}"]
    return process


@pytest.fixture
def oauth_server(oauth_process, settings):
    """The authorization-code server, forgetting every client and token of earlier tests."""
    return _fresh(oauth_process, settings)


@pytest.fixture
def cc_server(cc_process, settings):
    return _fresh(cc_process, settings)


def oauth_mcp_server(tenant, url: str, name: str = "secured", **fields) -> MCPServer:
    """A tenant admin's Streamable HTTP server with OAuth (not operator-configured)."""
    server = add_server(tenant, name, MCPServer.Transport.STREAMABLE_HTTP, url=url, by_operator=False)
    server.auth_mode = fields.pop("auth_mode", MCPServer.AuthMode.OAUTH)
    secret = fields.pop("client_secret", "")
    for key, value in fields.items():
        setattr(server, key, value)
    if secret:
        set_client_secret(server, secret)
    server.full_clean(validate_constraints=False)
    return save_server(server, by_operator=False)


def admin_browser(user) -> Client:
    browser = Client()
    browser.force_login(user)
    return browser


def connect_through_the_callback(browser: Client, server: MCPServer, oauth: OAuthServer):
    """Connect → the authorization server's page (auto-approved) → our callback → back in admin."""
    started = browser.post(reverse("admin:tools_app_mcpserver_connect", args=[server.pk]))
    assert started.status_code == 302, started.content
    authorize = started["Location"]
    assert authorize.startswith(f"{oauth.base}/authorize?")
    approved = httpx2.get(authorize, follow_redirects=False)
    assert approved.status_code == 302, approved.text
    back = urlsplit(approved.headers["location"])
    assert (back.netloc, back.path) == ("testserver", "/mcp/oauth/callback/")
    return browser.get(f"{back.path}?{back.query}")


def stored_tokens(server: MCPServer) -> dict:
    grant = MCPOAuthGrant.objects.get(server=server)
    import json

    return json.loads(decrypt(grant.tokens_encrypted)) if grant.tokens_encrypted else {}


def wait_for_expiry(server: MCPServer) -> None:
    grant = MCPOAuthGrant.objects.get(server=server)
    deadline = time.monotonic() + TOKEN_SECONDS * 5
    while timezone.now() <= grant.expires_at:
        assert time.monotonic() < deadline, "the access token never expired"
        time.sleep(0.2)


def run_in_a_session(tenant, owner, model_server, tool_name: str, text: str) -> Message:
    from sessions_app.runtime import engine

    session = new_session(tenant, owner)
    engine.add_selected_capabilities(session.pk, None, tools=[tool_name], added_by="test")
    model_server.script(
        "agent", tool_reply([tool_call(tool_name, {"text": text}, id="call")]), text_reply("done")
    )
    send(session, f"echo {text}")
    drive_until_idle(session)
    return Message.objects.get(session=session, tool_call_id="call")


def test_an_admin_connects_through_the_callback_and_a_session_runs_its_tool(
    tenant_a, owner_a, model_config_a, model_server, oauth_server
):
    server = oauth_mcp_server(tenant_a, oauth_server.url)
    assert authorization_status(server) == "needs_consent"
    browser = admin_browser(owner_a)

    landed = connect_through_the_callback(browser, server, oauth_server)

    assert landed.status_code == 302
    assert landed["Location"] == reverse("admin:tools_app_mcpserver_change", args=[server.pk])
    assert authorization_status(server) == "connected"
    assert list(Tool.objects.filter(mcp_server=server).values_list("name", flat=True)) == ["secured__echo"]
    stats = oauth_server.stats()
    assert (stats["registrations"], stats["authorizations"], stats["code_grants"]) == (1, 1, 1)
    attempt = MCPOAuthAttempt.objects.get(server=server)
    assert attempt.status == "connected" and attempt.code_encrypted == ""
    page = browser.get(reverse("admin:tools_app_mcpserver_change", args=[server.pk])).content.decode()
    assert "connected" in page and "Connect" in page and "Revoke" in page

    result = run_in_a_session(tenant_a, owner_a, model_server, "secured__echo", "hello")
    assert not result.is_error and result.content == "echo: hello"


def test_an_expired_access_token_is_refreshed_without_anyone(tenant_a, owner_a, oauth_server, tmp_path):
    server = oauth_mcp_server(tenant_a, oauth_server.url)
    connect_through_the_callback(admin_browser(owner_a), server, oauth_server)
    before = stored_tokens(server)
    wait_for_expiry(server)

    ctx = ToolContext(session_id="s-1", tenant_id=tenant_a.pk, workspace=tmp_path, port=None)
    tool = MCPTool.from_row(Tool.objects.select_related("mcp_server").get(name="secured__echo"))
    result = tool.run(ctx, {"text": "after expiry"})

    assert not result.is_error and result.content == "echo: after expiry"
    after = stored_tokens(server)
    assert after["access_token"] != before["access_token"]
    assert after["refresh_token"] != before["refresh_token"]  # the server rotates them
    assert oauth_server.stats()["refresh_grants"] == 1
    assert oauth_server.stats()["authorizations"] == 1  # nobody was asked again
    assert authorization_status(server) == "connected"


def test_concurrent_calls_after_expiry_refresh_once_and_both_succeed(
    tenant_a, owner_a, oauth_server, tmp_path
):
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    server = oauth_mcp_server(tenant_a, oauth_server.url)
    connect_through_the_callback(admin_browser(owner_a), server, oauth_server)
    wait_for_expiry(server)
    tool = MCPTool.from_row(Tool.objects.select_related("mcp_server").get(name="secured__echo"))

    def call(n: int) -> str:
        try:
            ctx = ToolContext(session_id=f"s-{n}", tenant_id=tenant_a.pk, workspace=tmp_path, port=None)
            return tool.run(ctx, {"text": str(n)}).content
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = sorted(pool.map(call, range(4)))

    # The refresh token rotates: a second refresh with the same one would have been refused.
    assert answers == ["echo: 0", "echo: 1", "echo: 2", "echo: 3"]
    assert oauth_server.stats()["refresh_grants"] == 1
    assert authorization_status(server) == "connected"


def test_a_revoked_consent_gives_a_clear_error_naming_who_can_fix_it(
    tenant_a, owner_a, model_config_a, model_server, oauth_server
):
    server = oauth_mcp_server(tenant_a, oauth_server.url)
    connect_through_the_callback(admin_browser(owner_a), server, oauth_server)
    oauth_server.revoke_all()  # the person withdrew the consent on the server's side
    wait_for_expiry(server)  # so the call tries the refresh token, which is dead too

    result = run_in_a_session(tenant_a, owner_a, model_server, "secured__echo", "hi")

    assert result.is_error
    assert "needs an admin of this tenant to connect it" in result.content
    assert "Admin → MCP servers → secured → Connect" in result.content
    assert "did not answer within" not in result.content  # an answer, not a timeout
    assert authorization_status(server) == "needs_consent"
    assert oauth_server.stats()["refresh_grants"] == 0
    ended = SessionEvent.objects.get(session=result.session, type="tool.ended", data__call_id="call")
    assert ended.data["ok"] is False and "needs an admin" in ended.data["summary"]

    # The next call fails before any network: nobody can consent from a Session.
    with pytest.raises(AuthorizationRequired, match="needs an admin"):
        connection_for(server, {})


def test_an_admin_revokes_and_the_next_call_fails_at_once(tenant_a, owner_a, oauth_server, tmp_path):
    server = oauth_mcp_server(tenant_a, oauth_server.url)
    browser = admin_browser(owner_a)
    connect_through_the_callback(browser, server, oauth_server)
    key_before = connection_for(server, {}).auth_key

    assert oauth_server.stats()["live_refresh_tokens"] == 1

    revoked = browser.post(reverse("admin:tools_app_mcpserver_revoke", args=[server.pk]), follow=True)

    assert revoked.status_code == 200
    assert authorization_status(server) == "needs_consent"
    assert stored_tokens(server) == {}
    # The authorization server was told too (RFC 7009): neither token is good there any more.
    stats = oauth_server.stats()
    assert (stats["revocations"], stats["live_access_tokens"], stats["live_refresh_tokens"]) == (2, 0, 0)
    said = [str(m) for m in revoked.context["messages"]]
    assert any("revoked the refresh and access token(s)" in m for m in said), said
    ctx = ToolContext(session_id="s-1", tenant_id=tenant_a.pk, workspace=tmp_path, port=None)
    tool = MCPTool.from_row(Tool.objects.select_related("mcp_server").get(name="secured__echo"))
    with pytest.raises(ToolError) as refused:
        tool.run(ctx, {"text": "x"})
    assert refused.value.code == "mcp_authorization_required"
    assert "revoked by owner_a" in str(refused.value) and "Connect" in str(refused.value)

    connect_through_the_callback(browser, server, oauth_server)  # connecting again works
    assert authorization_status(server) == "connected"
    assert connection_for(server, {}).auth_key != key_before
    assert oauth_server.stats()["registrations"] == 1  # the registered client was kept

    # The audit log has each of them once per time, with who did it and never a token.
    log = AuditEntry.objects.for_tenant(tenant_a).filter(
        object_id=str(server.pk), action__startswith="mcp_oauth."
    )
    assert sorted(log.values_list("action", "actor_username")) == sorted(
        [("mcp_oauth.connect_started", "owner_a"), ("mcp_oauth.connected", "owner_a")] * 2
        + [("mcp_oauth.revoked", "owner_a")]
    )
    tokens = json.dumps(stored_tokens(server))
    assert all(tokens not in json.dumps(entry.changes) for entry in log)


@pytest.mark.parametrize("method", ["client_secret_basic", "client_secret_post", "none"])
def test_a_pre_registered_client_connects_with_its_token_endpoint_auth_method(
    tenant_a, owner_a, oauth_server, tmp_path, method
):
    secret = "" if method == "none" else f"pre-secret-{method}"
    httpx2.post(
        f"{oauth_server.base}/test/pre-register",
        json={
            "client_id": "pre-registered",
            "client_secret": secret,
            "token_endpoint_auth_method": method,
            "redirect_uri": "http://testserver/mcp/oauth/callback/",
        },
    ).raise_for_status()
    server = oauth_mcp_server(
        tenant_a,
        oauth_server.url,
        oauth_client_registration=MCPServer.ClientRegistration.PRE_REGISTERED,
        oauth_client_id="pre-registered",
        oauth_token_endpoint_auth_method=method,
        client_secret=secret,
    )

    connect_through_the_callback(admin_browser(owner_a), server, oauth_server)

    assert authorization_status(server) == "connected"
    stats = oauth_server.stats()
    assert (stats["registrations"], stats["code_grants"]) == (0, 1)
    wait_for_expiry(server)  # the refresh authenticates the same way
    ctx = ToolContext(session_id="s-1", tenant_id=tenant_a.pk, workspace=tmp_path, port=None)
    tool = MCPTool.from_row(Tool.objects.select_related("mcp_server").get(name="secured__echo"))
    assert tool.run(ctx, {"text": method}).content == f"echo: {method}"
    assert oauth_server.stats()["refresh_grants"] == 1


def test_a_step_up_asks_for_an_admin_and_keeps_the_tokens(tenant_a, owner_a, oauth_server, tmp_path):
    server = oauth_mcp_server(tenant_a, oauth_server.url)
    browser = admin_browser(owner_a)
    connect_through_the_callback(browser, server, oauth_server)
    httpx2.post(f"{oauth_server.base}/test/require-scope", json={"scope": "mcp:admin"}).raise_for_status()
    tool = MCPTool.from_row(Tool.objects.select_related("mcp_server").get(name="secured__echo"))
    ctx = ToolContext(session_id="s-1", tenant_id=tenant_a.pk, workspace=tmp_path, port=None)

    with pytest.raises(ToolError, match="asks for more permissions") as refused:
        tool.run(ctx, {"text": "x"})

    assert refused.value.code == "mcp_authorization_required"
    assert authorization_status(server) == "connected"  # still good for what was granted
    assert stored_tokens(server)["scope"] == "mcp:tools"
    assert oauth_server.stats()["authorizations"] == 1  # nobody was sent anywhere


def test_pointing_the_server_elsewhere_drops_its_tokens(tenant_a, owner_a, oauth_server):
    server = oauth_mcp_server(tenant_a, oauth_server.url)
    connect_through_the_callback(admin_browser(owner_a), server, oauth_server)
    server.refresh_from_db()
    server.timeout_seconds = 20  # not bound to the grant: kept
    save_server(server, by_operator=False)
    assert authorization_status(server) == "connected"

    server.url = oauth_server.url.replace("/mcp", "/other/mcp")
    save_server(server, by_operator=False)

    assert not MCPOAuthGrant.objects.filter(server=server).exists()
    assert authorization_status(server) == "needs_consent"


def test_client_credentials_connect_without_a_browser(tenant_a, owner_a, cc_server, tmp_path):
    server = oauth_mcp_server(
        tenant_a,
        cc_server.url,
        name="machine",
        auth_mode=MCPServer.AuthMode.CLIENT_CREDENTIALS,
        oauth_client_registration=MCPServer.ClientRegistration.PRE_REGISTERED,
        oauth_client_id=CC_ID,
        client_secret=CC_SECRET,
        oauth_issuer=cc_server.base,
    )
    browser = admin_browser(owner_a)

    connected = browser.post(reverse("admin:tools_app_mcpserver_connect", args=[server.pk]), follow=True)

    assert connected.redirect_chain[0][0] == reverse("admin:tools_app_mcpserver_change", args=[server.pk])
    assert [str(m) for m in connected.context["messages"]] == ["machine: connected; 1 tool(s)."]
    assert authorization_status(server) == "connected"
    ctx = ToolContext(session_id="s-1", tenant_id=tenant_a.pk, workspace=tmp_path, port=None)
    tool = MCPTool.from_row(Tool.objects.select_related("mcp_server").get(name="machine__echo"))
    assert tool.run(ctx, {"text": "m2m"}).content == "echo: m2m"
    assert cc_server.stats()["cc_grants"] == 1
    assert CC_SECRET not in connected.content.decode()


def test_client_credentials_with_client_secret_post_fetch_a_token_on_a_refresh(tenant_a, cc_server):
    server = oauth_mcp_server(
        tenant_a,
        cc_server.url,
        name="machine",
        auth_mode=MCPServer.AuthMode.CLIENT_CREDENTIALS,
        oauth_client_registration=MCPServer.ClientRegistration.PRE_REGISTERED,
        oauth_client_id=CC_ID,
        client_secret=CC_SECRET,
        oauth_token_endpoint_auth_method=MCPServer.TokenEndpointAuth.CLIENT_SECRET_POST,
    )
    assert [t.name for t in refresh_server(server).tools] == ["machine__echo"]
    assert cc_server.stats()["cc_grants"] == 1


def test_a_wrong_client_secret_says_the_token_request_was_refused(tenant_a, owner_a, cc_server):
    server = oauth_mcp_server(
        tenant_a,
        cc_server.url,
        name="machine",
        auth_mode=MCPServer.AuthMode.CLIENT_CREDENTIALS,
        oauth_client_registration=MCPServer.ClientRegistration.PRE_REGISTERED,
        oauth_client_id=CC_ID,
        client_secret="not-the-secret",
        oauth_issuer=cc_server.base,
    )
    page = admin_browser(owner_a).post(
        reverse("admin:tools_app_mcpserver_connect", args=[server.pk]), follow=True
    )
    said = [str(m) for m in page.context["messages"]]
    assert len(said) == 1 and said[0].startswith("Connecting MCP server 'machine' failed: the authorization")
    assert "not-the-secret" not in page.content.decode() and "not-the-secret" not in said[0]
    assert authorization_status(server) == "needs_consent"


def test_a_loopback_server_not_allow_listed_is_not_contacted(tenant_a, owner_a, oauth_server, settings):
    server = oauth_mcp_server(tenant_a, oauth_server.url)
    settings.XAGENT_OUTBOUND_ALLOWED_HOSTS = []  # the operator withdrew the exception

    page = admin_browser(owner_a).post(
        reverse("admin:tools_app_mcpserver_connect", args=[server.pk]), follow=True
    )

    said = [str(m) for m in page.context["messages"]]
    assert len(said) == 1 and "was not contacted: Outbound guard" in said[0]
    assert oauth_server.stats()["registrations"] == 0
    assert MCPOAuthAttempt.objects.count() == 0


def test_an_operator_configured_server_reaches_loopback_without_the_allow_list(
    tenant_a, owner_a, oauth_server, settings
):
    server = oauth_mcp_server(tenant_a, oauth_server.url)
    server.save(by_operator=True)
    settings.XAGENT_OUTBOUND_ALLOWED_HOSTS = []

    connect_through_the_callback(admin_browser(owner_a), server, oauth_server)

    assert authorization_status(server) == "connected"


# --- tenancy and secrecy ------------------------------------------------------------------


def test_another_tenants_admin_cannot_connect_revoke_or_complete(tenant_a, owner_a, outsider_b, oauth_server):
    server = oauth_mcp_server(tenant_a, oauth_server.url)
    outsider = admin_browser(outsider_b)
    assert outsider.post(reverse("admin:tools_app_mcpserver_connect", args=[server.pk])).status_code == 404
    assert outsider.post(reverse("admin:tools_app_mcpserver_revoke", args=[server.pk])).status_code == 404

    # A's admin starts; B's admin brings the callback (say, a link sent to them): refused, nothing stored.
    started = admin_browser(owner_a).post(reverse("admin:tools_app_mcpserver_connect", args=[server.pk]))
    approved = httpx2.get(started["Location"], follow_redirects=False)
    back = urlsplit(approved.headers["location"])
    refused = outsider.get(f"{back.path}?{back.query}")
    assert refused.status_code == 404
    assert "unknown to this workspace" in refused.content.decode()
    attempt = MCPOAuthAttempt.objects.get(server=server)
    assert attempt.status == "waiting" and attempt.code_encrypted == ""
    assert not MCPOAuthGrant.objects.filter(server=server).exclude(tokens_encrypted="").exists()


def test_unknown_or_expired_states_are_refused_with_a_clear_page(tenant_a, owner_a, oauth_server):
    server = oauth_mcp_server(tenant_a, oauth_server.url)
    browser = admin_browser(owner_a)
    unknown = browser.get("/mcp/oauth/callback/?state=nope&code=abc")
    assert unknown.status_code == 404 and "unknown to this workspace" in unknown.content.decode()
    missing = browser.get("/mcp/oauth/callback/")
    assert missing.status_code == 404

    started = browser.post(reverse("admin:tools_app_mcpserver_connect", args=[server.pk]))
    approved = httpx2.get(started["Location"], follow_redirects=False)
    MCPOAuthAttempt.objects.filter(server=server).update(expires_at=timezone.now())
    back = urlsplit(approved.headers["location"])
    expired = browser.get(f"{back.path}?{back.query}")
    assert expired.status_code == 400 and "expired" in expired.content.decode()
    assert authorization_status(server) == "needs_consent"


def test_an_anonymous_callback_goes_to_the_login(db):
    answer = Client().get("/mcp/oauth/callback/?state=x&code=y")
    assert answer.status_code == 302 and "/login" in answer["Location"]


def test_tokens_never_appear_in_admin_api_events_or_errors(
    tenant_a, owner_a, api_owner_a, model_config_a, model_server, oauth_server
):
    server = oauth_mcp_server(tenant_a, oauth_server.url)
    browser = admin_browser(owner_a)
    connect_through_the_callback(browser, server, oauth_server)
    tokens = stored_tokens(server)
    grant = MCPOAuthGrant.objects.get(server=server)
    import json

    client_secret = json.loads(decrypt(grant.client_info_encrypted)).get("client_secret")
    secrets = [tokens["access_token"], tokens["refresh_token"], client_secret]
    assert all(secrets)
    result = run_in_a_session(tenant_a, owner_a, model_server, "secured__echo", "x")
    oauth_server.revoke_all()
    failed = run_in_a_session(tenant_a, owner_a, model_server, "secured__echo", "y")

    shown = [
        browser.get(reverse("admin:tools_app_mcpserver_changelist")).content.decode(),
        browser.get(reverse("admin:tools_app_mcpserver_change", args=[server.pk])).content.decode(),
        api_owner_a.get("/api/v1/tools/").content.decode(),
        json.dumps(list(SessionEvent.objects.values_list("data", flat=True))),
        result.content,
        failed.content,
        MCPServer.objects.get(pk=server.pk).last_error,
        json.dumps(list(MCPOAuthAttempt.objects.values_list("outcome", flat=True))),
    ]
    for text in shown:
        for secret in secrets:
            assert secret not in text
    assert failed.is_error and "needs an admin" in failed.content


def test_a_server_without_oauth_is_not_used_and_needs_nothing(tenant_a, oauth_server):
    server = add_server(tenant_a, "plain", MCPServer.Transport.STREAMABLE_HTTP, url=oauth_server.url)
    assert authorization_status(server) == "not_used"
    conn = connection_for(server, {})
    assert conn.auth is None and conn.auth_key == ""
    with pytest.raises(Exception, match="401"):
        list_tools(conn)


def test_an_expired_token_without_a_refresh_token_is_expired_and_fails_at_once(tenant_a):
    from datetime import timedelta

    from tenancy_app.crypto import encrypt

    server = MCPServer.objects.create(
        tenant=tenant_a,
        name="remote",
        transport="streamable_http",
        url="https://mcp.example.com/mcp",
        auth_mode="oauth",
    )
    MCPOAuthGrant.objects.create(
        tenant=tenant_a,
        server=server,
        tokens_encrypted=encrypt('{"access_token": "at-old", "token_type": "Bearer", "expires_in": 60}'),
        expires_at=timezone.now() - timedelta(seconds=1),
        has_refresh_token=False,
    )
    assert authorization_status(server) == "expired"
    with pytest.raises(AuthorizationRequired, match="expired authorization and no refresh token"):
        connection_for(server, {})  # nothing is contacted: mcp.example.com is never resolved


def test_oauth_settings_are_checked(tenant_a):
    from django.core.exceptions import ValidationError

    stdio = MCPServer(tenant=tenant_a, name="local", transport="stdio", command="x", auth_mode="oauth")
    with pytest.raises(ValidationError, match="Streamable HTTP servers only"):
        stdio.full_clean(validate_constraints=False)
    http = MCPServer(
        tenant=tenant_a,
        name="remote",
        transport="streamable_http",
        url="https://mcp.example.com/mcp",
        auth_mode="oauth",
        headers={"Authorization": "Bearer x"},
    )
    with pytest.raises(ValidationError, match="gets its Authorization header from its tokens"):
        http.full_clean(validate_constraints=False)
    http.headers, http.auth_mode = {}, "client_credentials"
    with pytest.raises(ValidationError, match="need a client ID"):
        http.full_clean(validate_constraints=False)


def test_a_callback_with_nul_characters_is_refused_not_a_server_error(tenant_a, owner_a, oauth_server):
    # PostgreSQL cannot compare or store text holding NUL: the callback must refuse it before
    # the database does (found by QA on the production stack: a 500).
    browser = admin_browser(owner_a)
    for query in ("state=%00&code=x", "state=s&code=x&iss=%00", "state=a%00b&error=x"):
        answer = browser.get(f"/mcp/oauth/callback/?{query}")
        assert answer.status_code == 400, query
        assert "MCP server authorization" in answer.content.decode()


def test_repeated_connects_leave_one_waiting_attempt_and_no_piled_up_flows(tenant_a, owner_a, oauth_server):
    # Found by QA on the production stack: every Connect whose consent page was left open kept a
    # flow thread and its database connection for CONSENT_WAIT_SECONDS; 30 clicks held ~35
    # PostgreSQL connections, so a tenant admin could exhaust the shared database.
    import threading

    server = oauth_mcp_server(tenant_a, oauth_server.url)
    browser = admin_browser(owner_a)
    for _ in range(3):  # the browser never visits the authorization page: each attempt stays open
        started = browser.post(reverse("admin:tools_app_mcpserver_connect", args=[server.pk]))
        assert started.status_code == 302
    assert MCPOAuthAttempt.objects.filter(server=server, status="waiting").count() == 1

    def flows() -> int:
        return sum(1 for t in threading.enumerate() if t.name == f"mcp-oauth-{server.pk}")

    for _ in range(200):  # superseded flows end at their next poll
        if flows() == 1:
            break
        time.sleep(0.05)
    assert flows() == 1
    MCPOAuthAttempt.objects.filter(server=server).update(status="failed")  # let the last one end


def test_a_connect_deletes_the_servers_attempts_ended_over_a_day_ago(tenant_a, owner_a, oauth_server):
    from datetime import timedelta

    from django.utils import timezone

    server = oauth_mcp_server(tenant_a, oauth_server.url)
    other = oauth_mcp_server(tenant_a, oauth_server.url, name="other")
    long_ago, lately = timezone.now() - timedelta(days=2), timezone.now() - timedelta(hours=1)
    for target, state, expired in (
        (server, "old", long_ago),
        (server, "recent", lately),
        (other, "x", long_ago),
    ):
        MCPOAuthAttempt.objects.create(
            tenant=tenant_a,
            server=target,
            started_by=owner_a,
            state=state,
            status="failed",
            expires_at=expired,
        )

    started = admin_browser(owner_a).post(reverse("admin:tools_app_mcpserver_connect", args=[server.pk]))

    assert started.status_code == 302
    states = set(MCPOAuthAttempt.objects.values_list("state", flat=True))
    assert "old" not in states and {"recent", "x"} <= states  # a late callback of today still gets its page
    MCPOAuthAttempt.objects.filter(server=server).update(status="failed")  # let the flow end


def test_revoke_deletes_the_tokens_here_whatever_the_authorization_server_does(
    tenant_a, owner_a, oauth_server
):
    import socket

    internal = socket.create_server(("127.0.0.1", 0))  # an internal service; never allow-listed
    internal.setblocking(False)
    counting_server_url = f"http://127.0.0.1:{internal.getsockname()[1]}/revoke"
    server = oauth_mcp_server(tenant_a, oauth_server.url)
    browser = admin_browser(owner_a)
    grant = MCPOAuthGrant.objects.filter(server=server)
    revoke = reverse("admin:tools_app_mcpserver_revoke", args=[server.pk])
    cases = [
        ("", "names no revocation endpoint, so it was not told"),
        # Metadata naming an internal address: the tokens are not posted there (a tenant's server).
        (counting_server_url, "Outbound guard"),
    ]
    for endpoint, sentence in cases:
        connect_through_the_callback(browser, server, oauth_server)
        grant.update(revocation_endpoint=endpoint)

        said = [str(m) for m in browser.post(revoke, follow=True).context["messages"]]

        assert stored_tokens(server) == {} and authorization_status(server) == "needs_consent"
        assert any("stored tokens are deleted" in m and sentence in m for m in said), said
    assert oauth_server.stats()["revocations"] == 0
    with pytest.raises(BlockingIOError):
        internal.accept()  # nobody connected to it
    internal.close()
