"""Headless OAuth for `manage.py mcp_probe`: the official SDK's providers, in memory, no person.

This module owns how the probe authorizes — which SDK provider, fed from the command's options
or from an MCP conformance scenario (`MCP_CONFORMANCE_SCENARIO` / `MCP_CONFORMANCE_CONTEXT`).
Tokens and client registrations live only as long as the probe; nothing is stored. The
product's own, tenant-scoped authorizations (admin "Connect") are a different thing and are
not made here.

The authorization-code flow is completed without a browser: the authorization URL is fetched
without following redirects and the `code` and `state` are read from the redirect's `Location`.
That only works with an authorization server that approves without a person (test servers,
the conformance suite's); a real one answers with a login page and the probe says so.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from mcp.shared.exceptions import MCPDeprecationWarning
from pydantic import AnyUrl

AUTHORIZATION_CODE = "authorization_code"
CLIENT_CREDENTIALS = "client_credentials"
# Never served: the headless flow reads the redirect's Location instead of receiving it.
REDIRECT_URI = "http://localhost/mcp_probe/callback"
CLIENT_NAME = "xagent-workspace mcp_probe"
REDIRECT_STATUSES = (301, 302, 303, 307, 308)


class HeadlessAuthorizationError(Exception):
    """The authorization server did not approve without a person; the message says what it did
    (no final period: the client's error sentence ends it)."""


@dataclass(frozen=True)
class ProbeAuth:
    """How the probe authorizes. `client_id` empty: dynamic client registration (or the
    client-ID metadata document at `client_metadata_url`, where the server supports one)."""

    flow: str = AUTHORIZATION_CODE
    client_id: str = ""
    client_secret: str = ""
    private_key_pem: str = ""  # client credentials with private_key_jwt instead of a secret
    signing_algorithm: str = "RS256"
    scope: str | None = None
    client_metadata_url: str | None = None
    issuer: str | None = None  # the authorization server client credentials belong to


class InMemoryTokenStorage:
    """The SDK's TokenStorage, for one probe: forgotten when the process ends."""

    def __init__(self, client_info: OAuthClientInformationFull | None = None) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info = client_info

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class HeadlessRedirect:
    """The provider's redirect and callback handlers, with no browser in between.

    `follow(url)` requests the authorization URL and keeps what its redirect carries;
    `callback()` hands that to the SDK, which checks the state and exchanges the code.
    """

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._result: AuthorizationCodeResult | None = None

    async def follow(self, authorization_url: str) -> None:
        async with httpx2.AsyncClient(timeout=self.timeout, follow_redirects=False) as http:
            response = await http.get(authorization_url)
        where = _without_query(authorization_url)
        location = response.headers.get("location", "")
        if response.status_code not in REDIRECT_STATUSES or not location:
            raise HeadlessAuthorizationError(
                f"The authorization page {where} answered HTTP {response.status_code} instead of redirecting "
                "back with a code: it wants a person (the probe only completes authorizations that are approved "
                "without one)"
            )
        query = {key: values[0] for key, values in parse_qs(urlsplit(location).query).items()}
        if "error" in query:
            detail = query.get("error_description", "")
            raise HeadlessAuthorizationError(
                f"The authorization server {where} refused: {query['error']}{': ' + detail if detail else ''}"
            )
        if not query.get("code"):
            raise HeadlessAuthorizationError(f"The authorization server {where} redirected without a code")
        self._result = AuthorizationCodeResult(
            code=query["code"], state=query.get("state"), iss=query.get("iss")
        )

    async def callback(self) -> AuthorizationCodeResult:
        if self._result is None:
            raise HeadlessAuthorizationError("No authorization code: the authorization page was not followed")
        result, self._result = self._result, None  # a code is used once
        return result


def provider_for(server_url: str, auth: ProbeAuth, timeout: float = 30.0) -> httpx2.Auth:
    """The SDK provider for `auth`, with in-memory storage (and the headless redirect)."""
    if auth.flow == CLIENT_CREDENTIALS:
        if not auth.client_id or not (auth.client_secret or auth.private_key_pem):
            raise ValueError(
                "the client-credentials grant needs a client ID and a client secret or private key"
            )
        with warnings.catch_warnings():
            # Without an issuer the SDK warns that the server picks the authorization server; for
            # a probe pointed at a test server that is the intent (the warning says so on every run).
            if auth.issuer is None:
                warnings.simplefilter("ignore", MCPDeprecationWarning)
            if auth.private_key_pem:
                assertion = SignedJWTParameters(
                    issuer=auth.client_id,
                    subject=auth.client_id,
                    signing_key=auth.private_key_pem,
                    signing_algorithm=auth.signing_algorithm,
                ).create_assertion_provider()
                return PrivateKeyJWTOAuthProvider(
                    server_url=server_url,
                    storage=InMemoryTokenStorage(),
                    client_id=auth.client_id,
                    assertion_provider=assertion,
                    scope=auth.scope,
                    issuer=auth.issuer,
                )
            return ClientCredentialsOAuthProvider(
                server_url=server_url,
                storage=InMemoryTokenStorage(),
                client_id=auth.client_id,
                client_secret=auth.client_secret,
                scope=auth.scope,
                issuer=auth.issuer,
            )
    if auth.flow != AUTHORIZATION_CODE:
        raise ValueError(f"unknown OAuth flow {auth.flow!r}")
    preregistered = None
    if auth.client_id:
        preregistered = OAuthClientInformationFull(
            client_id=auth.client_id,
            client_secret=auth.client_secret or None,
            redirect_uris=[AnyUrl(REDIRECT_URI)],
            token_endpoint_auth_method="client_secret_basic" if auth.client_secret else "none",
        )
    redirect = HeadlessRedirect(timeout=timeout)
    return OAuthClientProvider(
        server_url=server_url,
        client_metadata=OAuthClientMetadata(
            client_name=CLIENT_NAME,
            redirect_uris=[AnyUrl(REDIRECT_URI)],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            scope=auth.scope,
        ),
        storage=InMemoryTokenStorage(preregistered),
        redirect_handler=redirect.follow,
        callback_handler=redirect.callback,
        client_metadata_url=auth.client_metadata_url,
    )


def auth_for_scenario(
    scenario: str, context_json: str | None, client_metadata_url: str | None
) -> ProbeAuth | None:
    """What an MCP conformance scenario asks of the client: OAuth for `auth/*` scenarios — the
    client-credentials grant where the name says so, with the credentials (secret or private key)
    from the scenario's context; otherwise the authorization-code flow, pre-registered when the
    context carries a client ID. Other scenarios need no authorization."""
    if not scenario.startswith("auth/"):
        return None
    context = json.loads(context_json) if context_json else {}
    if not isinstance(context, dict):
        raise ValueError("MCP_CONFORMANCE_CONTEXT is not a JSON object")
    common = {
        "client_id": str(context.get("client_id") or ""),
        "client_secret": str(context.get("client_secret") or ""),
        "scope": context.get("scope") or None,
    }
    if "client-credentials" in scenario:
        return ProbeAuth(
            flow=CLIENT_CREDENTIALS,
            private_key_pem=str(context.get("private_key_pem") or ""),
            signing_algorithm=str(context.get("signing_algorithm") or "RS256"),
            **common,
        )
    return ProbeAuth(flow=AUTHORIZATION_CODE, client_metadata_url=client_metadata_url, **common)


def _without_query(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"
