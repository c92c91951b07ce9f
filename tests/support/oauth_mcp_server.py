"""An OAuth-protected MCP server for tests, built on the SDK's server-side auth helpers.

    python -m tests.support.oauth_mcp_server --port 8766 [--token-seconds 3]
    python -m tests.support.oauth_mcp_server --port 8767 --client-credentials CLIENT_ID:SECRET

Authorization code mode: the SDK's authorization server routes (metadata, dynamic client
registration, /authorize, /token with PKCE, /revoke) over `AutoApproveProvider`, whose
/authorize approves at once (redirects to the client's redirect URI with code and state);
the MCP endpoint /mcp requires a bearer token with the `mcp:tools` scope, and says where its
protected-resource metadata is in its 401. Access tokens live `--token-seconds`; refresh
tokens rotate (a used one is dead).

Client credentials mode: a resource server (the SDK's bearer middleware and protected-resource
metadata) with a tiny token endpoint of its own for the `client_credentials` grant, which the
SDK's authorization server does not implement; client_secret_basic and client_secret_post.

Test-only routes: `POST /test/revoke-all` kills every token (a consent withdrawn on the
server's side); `POST /test/require-scope {"scope": ...}` makes /mcp ask for one more scope
(403 insufficient_scope, a step-up); `POST /test/pre-register` adds a client as an operator
would out of band; `POST /test/reset` forgets everything (clients too), so one process serves a
whole test module; `GET /test/stats` counts registrations, authorizations and token grants.
Separate process, no Django.
"""

from __future__ import annotations

import argparse
import base64
import secrets
import time
from urllib.parse import unquote

from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from starlette.requests import Request
from starlette.responses import JSONResponse

SCOPE = "mcp:tools"
SCOPES = [SCOPE, "mcp:admin"]  # mcp:admin is asked for only after /test/require-scope
STATS = {
    "registrations": 0,
    "authorizations": 0,
    "code_grants": 0,
    "refresh_grants": 0,
    "cc_grants": 0,
    "revocations": 0,  # tokens revoked through /revoke (RFC 7009)
}


class AutoApproveProvider:
    """`OAuthAuthorizationServerProvider` in memory; every authorization is approved."""

    def __init__(self, token_seconds: int):
        self.token_seconds = token_seconds
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        STATS["registrations"] += 1
        # The client may later ask for any scope this server knows (a step-up needs no new registration).
        client_info.scope = " ".join(SCOPES)
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        STATS["authorizations"] += 1
        code = secrets.token_urlsafe(32)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [SCOPE],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
            subject="alice",
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client, authorization_code: str) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    async def exchange_authorization_code(self, client, authorization_code: AuthorizationCode) -> OAuthToken:
        STATS["code_grants"] += 1
        self.codes.pop(authorization_code.code, None)
        return self._issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(self, client, refresh_token: str) -> RefreshToken | None:
        found = self.refresh.get(refresh_token)
        return found if found is not None and found.client_id == client.client_id else None

    async def exchange_refresh_token(
        self, client, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        if self.refresh.pop(refresh_token.token, None) is None:
            raise TokenError(error="invalid_grant", error_description="refresh token revoked")
        STATS["refresh_grants"] += 1
        return self._issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token) -> None:
        STATS["revocations"] += 1
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def revoke_all(self) -> None:
        self.access.clear()
        self.refresh.clear()

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access, refresh = f"at-{secrets.token_urlsafe(24)}", f"rt-{secrets.token_urlsafe(24)}"
        expires_at = int(time.time()) + self.token_seconds
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires_at, resource=resource
        )
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource
        )
        return OAuthToken(
            access_token=access,
            expires_in=self.token_seconds,
            scope=" ".join(scopes),
            refresh_token=refresh,
        )


class IssuedTokens:
    """The token verifier of client-credentials mode (the tokens its /token issued)."""

    def __init__(self, provider: AutoApproveProvider):
        self.provider = provider

    async def verify_token(self, token: str) -> AccessToken | None:
        return await self.provider.load_access_token(token)


def build(port: int, token_seconds: int, client_credentials: str = "") -> MCPServer:
    base = f"http://127.0.0.1:{port}"
    provider = AutoApproveProvider(token_seconds)
    auth = AuthSettings(
        issuer_url=base,
        resource_server_url=f"{base}/mcp",
        required_scopes=[SCOPE],
        validate_token_resource=False,
        client_registration_options=ClientRegistrationOptions(
            enabled=True, valid_scopes=SCOPES, default_scopes=[SCOPE]
        ),
        revocation_options=RevocationOptions(enabled=True),
    )
    if client_credentials:
        server = MCPServer(
            "xagent-oauth-test", auth=auth, token_verifier=IssuedTokens(provider), log_level="WARNING"
        )
        _add_client_credentials_routes(server, provider, base, *client_credentials.split(":", 1))
    else:
        server = MCPServer("xagent-oauth-test", auth=auth, auth_server_provider=provider, log_level="WARNING")

    @server.tool(description="Echo the text back, with who called.", structured_output=False)
    def echo(text: str, ctx: Context) -> str:
        return f"echo: {text}"

    @server.custom_route("/test/revoke-all", methods=["POST"])
    async def revoke_all(request: Request) -> JSONResponse:
        provider.revoke_all()
        return JSONResponse({"revoked": True})

    @server.custom_route("/test/pre-register", methods=["POST"])
    async def pre_register(request: Request) -> JSONResponse:
        # A client an operator registered out of band (no dynamic registration).
        body = await request.json()
        provider.clients[body["client_id"]] = OAuthClientInformationFull(
            client_id=body["client_id"],
            client_secret=body.get("client_secret") or None,
            token_endpoint_auth_method=body["token_endpoint_auth_method"],
            redirect_uris=[body["redirect_uri"]],
            grant_types=["authorization_code", "refresh_token"],
            scope=" ".join(SCOPES),
        )
        return JSONResponse({"registered": body["client_id"]})

    @server.custom_route("/test/require-scope", methods=["POST"])
    async def require_scope(request: Request) -> JSONResponse:
        # The bearer middleware holds this very list: tokens without the scope now get a 403
        # insufficient_scope (a step-up), as when a server starts asking for more.
        scope = (await request.json())["scope"]
        auth.required_scopes.append(scope)
        return JSONResponse({"required": auth.required_scopes})

    @server.custom_route("/test/reset", methods=["POST"])
    async def reset(request: Request) -> JSONResponse:
        del auth.required_scopes[1:]
        provider.clients.clear()
        provider.codes.clear()
        provider.revoke_all()
        STATS.update(dict.fromkeys(STATS, 0))
        return JSONResponse({"reset": True})

    @server.custom_route("/test/stats", methods=["GET"])
    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(
            STATS | {"live_access_tokens": len(provider.access), "live_refresh_tokens": len(provider.refresh)}
        )

    return server


def _add_client_credentials_routes(
    server: MCPServer, provider, base: str, client_id: str, secret: str
) -> None:
    @server.custom_route("/.well-known/oauth-authorization-server", methods=["GET"])
    async def metadata(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "issuer": base,
                "authorization_endpoint": f"{base}/authorize",
                "token_endpoint": f"{base}/token",
                "grant_types_supported": ["client_credentials"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
                "scopes_supported": [SCOPE],
            }
        )

    @server.custom_route("/token", methods=["POST"])
    async def token(request: Request) -> JSONResponse:
        form = await request.form()
        given_id, given_secret = form.get("client_id"), form.get("client_secret")
        header = request.headers.get("authorization", "")
        if header.lower().startswith("basic "):
            decoded = base64.b64decode(header[6:]).decode()
            given_id, _, given_secret = (unquote(part) for part in decoded.partition(":"))
        if form.get("grant_type") != "client_credentials":
            return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
        if given_id != client_id or given_secret != secret:
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        STATS["cc_grants"] += 1
        issued = provider._issue(client_id, [SCOPE], form.get("resource"))
        body = issued.model_dump(exclude_none=True)
        body.pop("refresh_token", None)  # client credentials: no refresh token (RFC 6749 §4.4.3)
        provider.refresh.pop(issued.refresh_token, None)
        return JSONResponse(body)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-seconds", type=int, default=3600)
    parser.add_argument("--client-credentials", default="", help="CLIENT_ID:SECRET (client credentials mode)")
    options = parser.parse_args(argv)
    server = build(options.port, options.token_seconds, options.client_credentials)
    server.run("streamable-http", host=options.host, port=options.port)


if __name__ == "__main__":
    main()
