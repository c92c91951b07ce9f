"""`mcp_probe` as a conformance client: the headless OAuth redirect (against a real loopback
authorization endpoint), what a conformance scenario asks for, and elicitation defaults."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from django.core.management import CommandError, call_command
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
)

from tools_app.management.commands.mcp_probe import answer_with_defaults
from tools_app.mcp.probe_auth import (
    AUTHORIZATION_CODE,
    CLIENT_CREDENTIALS,
    HeadlessAuthorizationError,
    HeadlessRedirect,
    ProbeAuth,
    auth_for_scenario,
    provider_for,
)

CIMD = "https://client.example/metadata.json"


class AuthorizationEndpoint(BaseHTTPRequestHandler):
    """/approve redirects back with a code for the request's state; /deny with an error;
    /login answers a page (a person would have to sign in). Every request is recorded."""

    seen: list[str] = []

    def do_GET(self):
        type(self).seen.append(self.path)
        url = urlsplit(self.path)
        query = {key: values[0] for key, values in parse_qs(url.query).items()}
        if url.path == "/approve":
            back = {
                "code": f"code-for-{query['client_id']}",
                "state": query["state"],
                "iss": "http://issuer.test",
            }
            self.send_response(302)
            self.send_header("Location", f"{query['redirect_uri']}?{urlencode(back)}")
        elif url.path == "/deny":
            back = {
                "error": "access_denied",
                "error_description": "the user said no",
                "state": query["state"],
            }
            self.send_response(302)
            self.send_header("Location", f"{query['redirect_uri']}?{urlencode(back)}")
        else:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<form>sign in</form>")

    def log_message(self, *args):
        pass


@pytest.fixture
def authorization_server():
    AuthorizationEndpoint.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), AuthorizationEndpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def authorization_url(base: str, path: str) -> str:
    query = {"client_id": "probe-client", "state": "st-123", "redirect_uri": "http://localhost/cb"}
    return f"{base}{path}?{urlencode(query)}"


def test_the_headless_redirect_hands_the_code_and_state_to_the_callback(authorization_server):
    redirect = HeadlessRedirect(timeout=5)

    async def flow():
        await redirect.follow(authorization_url(authorization_server, "/approve"))
        return await redirect.callback()

    result = asyncio.run(flow())

    assert (result.code, result.state, result.iss) == (
        "code-for-probe-client",
        "st-123",
        "http://issuer.test",
    )
    # One GET; the redirect itself is not followed (nothing listens at its localhost:80 callback).
    assert len(AuthorizationEndpoint.seen) == 1
    assert AuthorizationEndpoint.seen[0].startswith("/approve?")


def test_a_code_is_handed_over_once(authorization_server):
    redirect = HeadlessRedirect(timeout=5)

    async def flow():
        await redirect.follow(authorization_url(authorization_server, "/approve"))
        await redirect.callback()
        return await redirect.callback()

    with pytest.raises(HeadlessAuthorizationError, match="not followed"):
        asyncio.run(flow())


def test_a_login_page_is_reported_as_needing_a_person(authorization_server):
    redirect = HeadlessRedirect(timeout=5)

    with pytest.raises(HeadlessAuthorizationError) as failed:
        asyncio.run(redirect.follow(authorization_url(authorization_server, "/login")))

    message = str(failed.value)
    assert f"{authorization_server}/login answered HTTP 200" in message
    assert "wants a person" in message
    assert "st-123" not in message  # the query (state, client) stays out of messages


def test_a_refusal_names_the_oauth_error(authorization_server):
    redirect = HeadlessRedirect(timeout=5)

    with pytest.raises(HeadlessAuthorizationError, match="refused: access_denied: the user said no"):
        asyncio.run(redirect.follow(authorization_url(authorization_server, "/deny")))


def test_elicitation_is_accepted_with_each_default():
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "default": "John Doe"},
            "age": {"type": "integer", "default": 30},
            "score": {"type": "number", "default": 95.5},
            "status": {"type": "string", "enum": ["active", "inactive"], "default": "inactive"},
            "verified": {"type": "boolean", "default": False},
            "nickname": {"type": "string"},  # optional, no default: left out
        },
    }

    answer = answer_with_defaults("Who are you?", schema)

    assert answer.action == "accept"
    assert answer.content == {
        "name": "John Doe",
        "age": 30,
        "score": 95.5,
        "status": "inactive",
        "verified": False,
    }


def test_a_required_field_without_a_default_gets_the_probe_value():
    schema = {
        "type": "object",
        "properties": {
            "colour": {"type": "string", "enum": ["red", "green"]},
            "count": {"type": "integer"},
            "agree": {"type": "boolean"},
            "note": {"type": "string"},
        },
        "required": ["colour", "count", "agree"],
    }

    assert answer_with_defaults("Pick", schema).content == {"colour": "red", "count": 1, "agree": True}


def test_an_empty_schema_is_accepted_empty():
    assert answer_with_defaults("Continue?", {}).content == {}


@pytest.mark.parametrize("scenario", ["initialize", "sse-retry", "elicitation-sep1034-client-defaults"])
def test_scenarios_without_auth_need_no_provider(scenario):
    assert auth_for_scenario(scenario, None, CIMD) is None


def test_an_auth_scenario_uses_the_authorization_code_flow_with_the_metadata_document():
    auth = auth_for_scenario("auth/metadata-default", None, CIMD)

    assert auth == ProbeAuth(flow=AUTHORIZATION_CODE, client_metadata_url=CIMD)


def test_client_credentials_scenarios_take_their_credentials_from_the_context():
    secret = auth_for_scenario(
        "auth/client-credentials-basic", json.dumps({"client_id": "c1", "client_secret": "s1"}), CIMD
    )
    jwt = auth_for_scenario(
        "auth/client-credentials-jwt",
        json.dumps({"client_id": "c2", "private_key_pem": "PEM", "signing_algorithm": "ES256"}),
        CIMD,
    )

    assert (secret.flow, secret.client_id, secret.client_secret) == (CLIENT_CREDENTIALS, "c1", "s1")
    assert (jwt.flow, jwt.client_id, jwt.private_key_pem, jwt.signing_algorithm) == (
        CLIENT_CREDENTIALS,
        "c2",
        "PEM",
        "ES256",
    )


def test_a_context_with_a_client_id_means_a_preregistered_client():
    auth = auth_for_scenario(
        "auth/pre-registration", json.dumps({"client_id": "c3", "client_secret": "s3"}), None
    )

    assert (auth.flow, auth.client_id, auth.client_secret) == (AUTHORIZATION_CODE, "c3", "s3")


@pytest.mark.parametrize("context", ["not json", "[1, 2]"])
def test_a_broken_context_is_refused(context):
    with pytest.raises(ValueError):
        auth_for_scenario("auth/metadata-default", context, None)


def test_each_flow_gets_the_sdks_provider():
    url = "http://127.0.0.1:9/mcp"

    code = provider_for(url, ProbeAuth(flow=AUTHORIZATION_CODE, client_id="c", client_secret="s"))
    secret = provider_for(url, ProbeAuth(flow=CLIENT_CREDENTIALS, client_id="c", client_secret="s"))
    signed = provider_for(url, ProbeAuth(flow=CLIENT_CREDENTIALS, client_id="c", private_key_pem="PEM"))

    assert type(code) is OAuthClientProvider
    assert asyncio.run(code.context.storage.get_client_info()).client_id == "c"  # pre-registered: no DCR
    assert type(secret) is ClientCredentialsOAuthProvider
    assert type(signed) is PrivateKeyJWTOAuthProvider
    with pytest.raises(ValueError, match="client ID"):
        provider_for(url, ProbeAuth(flow=CLIENT_CREDENTIALS, client_id="c"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--client-id", "c"], "need --oauth or --client-credentials"),
        (["--client-credentials", "--client-id", "c"], "needs --client-id and --client-secret"),
        (["--client-credentials", "--client-id", "c", "--private-key", "/nonexistent.pem"], "--private-key"),
        (["--oauth", "--client-metadata-url", "http://plain.example/client.json"], "valid HTTPS URL"),
    ],
)
def test_mcp_probe_refuses_incomplete_oauth_options(args, message, monkeypatch):
    monkeypatch.delenv("MCP_CONFORMANCE_SCENARIO", raising=False)
    with pytest.raises(CommandError, match=message):
        call_command("mcp_probe", *args, "http://127.0.0.1:9/mcp", stdout=StringIO())


def test_mcp_probe_refuses_a_broken_scenario_context(monkeypatch):
    monkeypatch.setenv("MCP_CONFORMANCE_SCENARIO", "auth/client-credentials-basic")
    monkeypatch.setenv("MCP_CONFORMANCE_CONTEXT", "{broken")

    with pytest.raises(CommandError, match="MCP_CONFORMANCE_CONTEXT"):
        call_command("mcp_probe", "http://127.0.0.1:9/mcp", stdout=StringIO())


class ProtectedResource(BaseHTTPRequestHandler):
    """An MCP endpoint that demands OAuth, with its discovery documents, a registration endpoint
    and an authorization page that wants a person to sign in (as real ones do)."""

    seen: list[str] = []

    def base(self) -> str:
        return f"http://{self.headers['Host']}"

    def answer(self, status: int, document: dict | None = None, headers: dict | None = None) -> None:
        body = json.dumps(document).encode() if document is not None else b""
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/register":
            self.answer(201, {"client_id": "registered-probe", "redirect_uris": ["http://localhost/cb"]})
        else:
            challenge = f'Bearer resource_metadata="{self.base()}/.well-known/oauth-protected-resource/mcp"'
            self.answer(401, {"error": "unauthorized"}, {"WWW-Authenticate": challenge})

    def do_GET(self):
        base = self.base()
        if self.path.startswith("/.well-known/oauth-protected-resource"):
            self.answer(200, {"resource": f"{base}/mcp", "authorization_servers": [base]})
        elif self.path == "/.well-known/oauth-authorization-server":
            self.answer(
                200,
                {
                    "issuer": base,
                    "authorization_endpoint": f"{base}/authorize",
                    "token_endpoint": f"{base}/token",
                    "registration_endpoint": f"{base}/register",
                    "response_types_supported": ["code"],
                    "code_challenge_methods_supported": ["S256"],
                },
            )
        elif self.path.startswith("/authorize"):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<form>sign in</form>")
        else:
            self.answer(404)

    def log_message(self, *args):
        type(self).seen.append(self.requestline)


def test_mcp_probe_oauth_stops_clearly_where_a_person_must_sign_in(monkeypatch):
    monkeypatch.delenv("MCP_CONFORMANCE_SCENARIO", raising=False)
    ProtectedResource.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), ProtectedResource)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(CommandError) as failed:
            call_command("mcp_probe", "--oauth", "--timeout", "10", f"{base}/mcp", stdout=StringIO())
    finally:
        server.shutdown()
        server.server_close()

    message = str(failed.value)
    assert f"The authorization page {base}/authorize answered HTTP 200" in message
    assert message.endswith("approved without one).")
    # The SDK's provider did the discovery and registration, and asked with PKCE and the resource.
    paths = [line.split()[1] for line in ProtectedResource.seen]
    assert paths[1:4] == [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-authorization-server",
        "/register",
    ]
    authorize = parse_qs(urlsplit(paths[4]).query)
    assert authorize["client_id"] == ["registered-probe"]
    assert authorize["code_challenge_method"] == ["S256"]
    assert authorize["resource"] == [f"{base}/mcp"]
