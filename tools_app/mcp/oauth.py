"""OAuth 2.1 for Streamable HTTP MCP servers, through the official SDK's providers.

This module owns `MCPOAuthGrant` (the tokens and registered client of one tenant for one
server, encrypted at rest) and `MCPOAuthAttempt` (one admin's "Connect", keyed by `state`).
The flows themselves are the SDK's: `OAuthClientProvider` (authorization code + PKCE,
discovery, dynamic registration or a client-ID metadata document, resource indicators,
step-up) and `ClientCredentialsOAuthProvider`. What this module adds:

- `GrantStorage`, the SDK's `TokenStorage` on the database, so tokens a provider refreshes are
  persisted for every worker, and a refresh cannot undo a revoke (compare-and-set on versions);
- `oauth_for(server)`, the builder every connection goes through (`client.connection_for`):
  in a Session or a refresh nobody can consent, so a server without usable tokens fails at once
  with `AuthorizationRequired`, and a provider that would need a person raises instead of waiting;
- "Connect" for admins: the provider's flow runs in a thread of the web process; its redirect
  handler hands the authorization URL to the admin's browser, its callback handler waits
  (bounded) for the code our callback route stores under the `state`, from any web process.

Tokens and client secrets never leave this module in clear except as the `Authorization`
header the provider sets; error messages are built here from the kind of failure, never from
what a tenant-configured endpoint answered.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
import warnings
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import parse_qs, quote, urlsplit

import anyio
import httpx2
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections, transaction
from django.db.models import F, Q
from django.utils import timezone
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.exceptions import OAuthFlowError, OAuthRegistrationError, OAuthTokenError
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.auth.utils import extract_field_from_www_auth
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from mcp.shared.exceptions import MCPDeprecationWarning

from tenancy_app import audit
from tenancy_app.crypto import decrypt, encrypt
from tools_app.models import MCPOAuthAttempt, MCPOAuthGrant, MCPServer
from tools_app.net import (
    OutboundRefused,
    async_guarded_transport,
    guarded_transport,
    origin_of,
    refusal_in,
)
from tools_app.secrets import Redactor, resolve_refs, tenant_secret_values

from .client import AuthorizationRequired, MCPError

logger = logging.getLogger(__name__)

CALLBACK_PATH = "/mcp/oauth/callback/"
CLIENT_NAME = "xAgent workspace"
# How long an admin has to finish the authorization page before the attempt is dropped.
CONSENT_WAIT_SECONDS = 600
# Ended attempts are kept this long (a late callback still gets a page saying how it went),
# then deleted at the server's next Connect.
ATTEMPT_KEPT = timedelta(days=1)
CALLBACK_POLL_SECONDS = 0.25
# One worker refreshes a grant at a time; a holder that died frees it after this long.
REFRESH_LEASE_SECONDS = 30
# A token is treated as expired this long before the server would say so (capped at half its
# lifetime), so a call does not start with a token that dies in flight: that would look like
# a lost consent (the SDK answers a 401 with a new authorization, not a refresh).
EXPIRY_MARGIN_SECONDS = 5


class AuthorizationStatus:
    NOT_USED = "not_used"
    CONNECTED = "connected"
    EXPIRED = "expired"
    NEEDS_CONSENT = "needs_consent"

    LABELS = {
        NOT_USED: "not used",
        CONNECTED: "connected",
        EXPIRED: "expired",
        NEEDS_CONSENT: "needs consent",
    }


class ConsentTimedOut(Exception):
    pass


def callback_url(base_url: str = "") -> str:
    """The redirect URI registered with authorization servers: XAGENT_PUBLIC_URL (or, unset,
    the address the admin reached us at) + our callback route."""
    base = settings.XAGENT_PUBLIC_URL or base_url or "http://localhost"
    return base.rstrip("/") + CALLBACK_PATH


def needs_admin(server: MCPServer, why: str) -> str:
    """The sentence a Session's tool call gets when no person can fix it from there."""
    return (
        f"MCP server {server.name!r} {why}: it needs an admin of this tenant to connect it "
        f"(Admin → MCP servers → {server.name} → Connect)."
    )


# --- status ---------------------------------------------------------------------------------


def authorization_status(server: MCPServer, grant: MCPOAuthGrant | None = None) -> str:
    if not server.uses_oauth:
        return AuthorizationStatus.NOT_USED
    if grant is None:
        grant = MCPOAuthGrant.objects.filter(server_id=server.pk).first()
    if grant is None or not grant.tokens_encrypted:
        return AuthorizationStatus.NEEDS_CONSENT
    expired = grant.expires_at is not None and grant.expires_at <= timezone.now()
    # Client credentials fetch a new token without anyone: expired is not a state there.
    if expired and not grant.has_refresh_token and server.auth_mode == MCPServer.AuthMode.OAUTH:
        return AuthorizationStatus.EXPIRED
    return AuthorizationStatus.CONNECTED


# --- storage --------------------------------------------------------------------------------


def _db(fn):
    """Run `fn` in a worker thread with its own database connection, closed afterwards (the
    thread belongs to an event loop's executor that outlives nothing)."""

    def closing(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return sync_to_async(closing, thread_sensitive=False)


def _expiry(expires_in: int | None) -> timezone.datetime | None:
    if expires_in is None:
        return None
    return timezone.now() + timedelta(seconds=int(expires_in))


class GrantStorage:
    """The SDK's `TokenStorage` on `MCPOAuthGrant`, for one tenant's server.

    `connecting=True` is an admin's Connect: stored tokens are ignored (a new consent is asked
    for) and the tokens it gets replace the old ones as a new consent. Otherwise a token write
    is a refresh (or a client-credentials fetch) of the consent that was loaded: it is stored
    only if no admin revoked or reconnected meanwhile.
    """

    def __init__(
        self,
        server: MCPServer,
        *,
        connecting: bool = False,
        user_id: int | None = None,
        redirect_uri: str = "",
    ):
        self.server_id = server.pk
        self.tenant_id = server.tenant_id
        self.server = server
        self.connecting = connecting
        self.user_id = user_id
        self.redirect_uri = redirect_uri or callback_url()
        # What was last read, for compare-and-set writes.
        self.consent_version: int | None = None
        self.token_version: int | None = None
        self.expires_at = None
        # The authorization-server metadata the provider discovered (set by the provider), so
        # stored tokens keep the revocation endpoint of the server that issued them.
        self.discovered_metadata = lambda: None

    # -- the SDK's protocol

    async def get_tokens(self) -> OAuthToken | None:
        if self.connecting:
            return None
        return await _db(self._load_tokens)()

    async def set_tokens(self, tokens: OAuthToken) -> None:
        await _db(self._store_tokens)(tokens)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return await _db(self._load_client_info)()

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        if self.server.oauth_client_registration == MCPServer.ClientRegistration.PRE_REGISTERED:
            return  # the configuration is the record
        await _db(self._store_client_info)(client_info)

    # -- the refresh lease

    async def claim_refresh(self) -> bool:
        return await _db(self._claim_refresh)()

    async def release_refresh(self) -> None:
        await _db(self._release_refresh)()

    async def mark_consent_lost(self, reason: str) -> None:
        await _db(self._mark_consent_lost)(reason)

    # -- database side (sync)

    def _grant(self) -> MCPOAuthGrant | None:
        return MCPOAuthGrant.objects.for_tenant(self.tenant_id).filter(server_id=self.server_id).first()

    def _load_tokens(self) -> OAuthToken | None:
        grant = self._grant()
        if grant is None:
            return None
        self.consent_version, self.token_version = grant.consent_version, grant.token_version
        self.expires_at = grant.expires_at
        if not grant.tokens_encrypted:
            return None
        return OAuthToken.model_validate_json(decrypt(grant.tokens_encrypted))

    def _store_tokens(self, tokens: OAuthToken) -> None:
        values = {
            "tokens_encrypted": encrypt(tokens.model_dump_json(exclude_none=True)),
            "expires_at": _expiry(tokens.expires_in),
            "has_refresh_token": bool(tokens.refresh_token),
            "refresh_lease_until": None,
            "lost_reason": "",
            "token_version": F("token_version") + 1,
            "updated_at": timezone.now(),
        }
        metadata = self.discovered_metadata()
        if metadata is not None:  # otherwise (a refresh without discovery) the stored one stays
            endpoint = str(metadata.revocation_endpoint or "")
            values["revocation_endpoint"] = endpoint if len(endpoint) <= 500 else ""
        with transaction.atomic():
            grant = self._ensure_grant()
            if self.connecting:
                values |= {
                    "consent_version": F("consent_version") + 1,
                    "connected_at": timezone.now(),
                    "connected_by_id": self.user_id,
                }
                updated = MCPOAuthGrant.objects.filter(pk=grant.pk).update(**values)
            else:
                # A refresh of the consent we loaded: lost if an admin revoked or reconnected since.
                expected = self.consent_version if self.consent_version is not None else grant.consent_version
                updated = MCPOAuthGrant.objects.filter(pk=grant.pk, consent_version=expected).update(**values)
        if updated:
            fresh = MCPOAuthGrant.objects.get(pk=grant.pk)
            self.consent_version, self.token_version = fresh.consent_version, fresh.token_version
            self.expires_at = fresh.expires_at
            self.connecting = False  # later writes of this provider are refreshes of this consent
        else:
            logger.info(
                "MCP server %s: tokens not stored, its authorization changed meanwhile", self.server_id
            )

    def _load_client_info(self) -> OAuthClientInformationFull | None:
        server = self.server
        if server.oauth_client_registration == MCPServer.ClientRegistration.PRE_REGISTERED:
            secret = decrypt(server.oauth_client_secret_encrypted) or None
            return OAuthClientInformationFull(
                client_id=server.oauth_client_id,
                client_secret=secret,
                token_endpoint_auth_method=server.oauth_token_endpoint_auth_method,
                redirect_uris=[self.redirect_uri],
                grant_types=["authorization_code", "refresh_token"],
                scope=server.oauth_scopes or None,
            )
        grant = self._grant()
        if grant is None or not grant.client_info_encrypted:
            return None
        info = OAuthClientInformationFull.model_validate_json(decrypt(grant.client_info_encrypted))
        registered = [str(uri) for uri in (info.redirect_uris or [])]
        if self.connecting and registered and self.redirect_uri not in registered:
            return None  # registered for another callback URL (XAGENT_PUBLIC_URL changed): register again
        return info

    def _store_client_info(self, client_info: OAuthClientInformationFull) -> None:
        with transaction.atomic():
            grant = self._ensure_grant()
            MCPOAuthGrant.objects.filter(pk=grant.pk).update(
                client_info_encrypted=encrypt(client_info.model_dump_json(exclude_none=True)),
                updated_at=timezone.now(),
            )

    def _ensure_grant(self) -> MCPOAuthGrant:
        grant, _ = MCPOAuthGrant.objects.get_or_create(
            server_id=self.server_id, defaults={"tenant_id": self.tenant_id}
        )
        return grant

    def _claim_refresh(self) -> bool:
        now = timezone.now()
        return bool(
            MCPOAuthGrant.objects.filter(server_id=self.server_id, tenant_id=self.tenant_id)
            .filter(Q(refresh_lease_until__isnull=True) | Q(refresh_lease_until__lt=now))
            .update(refresh_lease_until=now + timedelta(seconds=REFRESH_LEASE_SECONDS))
        )

    def _release_refresh(self) -> None:
        MCPOAuthGrant.objects.filter(server_id=self.server_id, tenant_id=self.tenant_id).update(
            refresh_lease_until=None
        )

    def _mark_consent_lost(self, reason: str) -> None:
        if self.token_version is None:
            return
        # Only the tokens this provider saw: another worker's fresh tokens stay.
        MCPOAuthGrant.objects.filter(
            server_id=self.server_id, tenant_id=self.tenant_id, token_version=self.token_version
        ).exclude(tokens_encrypted="").update(
            tokens_encrypted="",
            expires_at=None,
            has_refresh_token=False,
            consent_version=F("consent_version") + 1,
            token_version=F("token_version") + 1,
            refresh_lease_until=None,
            lost_reason=reason[:300],
            updated_at=timezone.now(),
        )


# --- providers ------------------------------------------------------------------------------


class _StoredGrant:
    """What both providers add to the SDK's: the expiry of stored tokens, and refreshes that
    hold up when several workers share one grant.

    The SDK's `_initialize` loads tokens but not their expiry (an expired stored token would be
    sent, refused, and answered with a new authorization instead of a refresh), so it is set
    here from the stored `expires_at`. Refreshes are serialised with a lease on the grant row;
    a refresh refused because another worker already used the (rotated) refresh token adopts
    that worker's stored tokens.
    """

    storage: GrantStorage
    _holds_lease = False
    # The server's last answer to the request being authorized asked for more scope.
    asked_for_more_scope = False

    async def _auth_flow(self, request: httpx2.Request):
        """The SDK's flow, noting a step-up (403 insufficient_scope): it needs a new consent like
        a refused token does, but the tokens held stay good for what they were granted."""
        flow = super()._auth_flow(request)
        try:
            outgoing = await flow.__anext__()
            while True:
                response = yield outgoing
                if outgoing is request:
                    self.asked_for_more_scope = (
                        response.status_code == 403
                        and extract_field_from_www_auth(response, "error") == "insufficient_scope"
                    )
                outgoing = await flow.asend(response)
        except StopAsyncIteration:
            return
        finally:
            await flow.aclose()

    def _set_expiry_from_storage(self) -> None:
        expires_at = self.storage.expires_at
        if expires_at is None:
            self.context.token_expiry_time = None
            return
        lifetime = (self.context.current_tokens.expires_in or 0) if self.context.current_tokens else 0
        margin = min(EXPIRY_MARGIN_SECONDS, lifetime / 2) if lifetime else EXPIRY_MARGIN_SECONDS
        self.context.token_expiry_time = expires_at.timestamp() - margin

    async def _initialize(self) -> None:
        await super()._initialize()
        self._set_expiry_from_storage()
        if self.context.is_token_valid() or not self.context.can_refresh_token():
            return
        seen = self.storage.token_version
        if await self.storage.claim_refresh():
            self._holds_lease = True
            return
        # Another worker is refreshing this grant: wait (bounded) for its tokens.
        deadline = time.monotonic() + REFRESH_LEASE_SECONDS
        while time.monotonic() < deadline:
            await anyio.sleep(0.2)
            tokens = await self.storage.get_tokens()
            if self.storage.token_version != seen:
                self.context.current_tokens = tokens
                self._set_expiry_from_storage()
                return
            if await self.storage.claim_refresh():
                self._holds_lease = True
                return

    async def _handle_refresh_response(self, response: httpx2.Response) -> bool:
        used = self.storage.token_version
        refreshed = await super()._handle_refresh_response(response)
        if refreshed:
            self._holds_lease = False  # storing the tokens released it
            self._set_expiry_from_storage()
            return True
        stored = await self.storage.get_tokens()
        if self._holds_lease:
            await self.storage.release_refresh()
            self._holds_lease = False
        if stored is not None and self.storage.token_version != used:
            self.context.current_tokens = stored
            self._set_expiry_from_storage()
            if self.context.is_token_valid():
                return True
        return False


class StoredOAuthProvider(_StoredGrant, OAuthClientProvider):
    def __init__(self, *args, storage: GrantStorage, **kwargs):
        super().__init__(*args, storage=storage, **kwargs)
        self.storage = storage
        storage.discovered_metadata = lambda: self.context.oauth_metadata


class StoredClientCredentialsProvider(_StoredGrant, ClientCredentialsOAuthProvider):
    def __init__(self, *args, storage: GrantStorage, **kwargs):
        with warnings.catch_warnings():
            # Without an issuer the SDK warns (deprecated); an admin may leave it empty.
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            super().__init__(*args, storage=storage, **kwargs)
        self.storage = storage
        storage.discovered_metadata = lambda: self.context.oauth_metadata


def _client_metadata(server: MCPServer, redirect_uri: str) -> OAuthClientMetadata:
    method = server.oauth_token_endpoint_auth_method
    return OAuthClientMetadata(
        client_name=CLIENT_NAME,
        redirect_uris=[redirect_uri],
        grant_types=["authorization_code", "refresh_token"],
        token_endpoint_auth_method=method,
        scope=server.oauth_scopes or None,
        # Our callback is a web page of the product, not a loopback listener of a native app.
        application_type="web",
    )


def _provider(server: MCPServer, storage: GrantStorage, redirect_handler, callback_handler):
    if server.auth_mode == MCPServer.AuthMode.CLIENT_CREDENTIALS:
        return StoredClientCredentialsProvider(
            server.url,
            storage=storage,
            client_id=server.oauth_client_id,
            client_secret=decrypt(server.oauth_client_secret_encrypted),
            token_endpoint_auth_method=_client_credentials_auth_method(server),
            scope=server.oauth_scopes or None,
            issuer=server.oauth_issuer or None,
        )
    metadata_url = None
    if server.oauth_client_registration == MCPServer.ClientRegistration.METADATA_DOCUMENT:
        metadata_url = server.oauth_client_metadata_url
    return StoredOAuthProvider(
        server.url,
        _client_metadata(server, storage.redirect_uri),
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
        client_metadata_url=metadata_url,
    )


def _client_credentials_auth_method(server: MCPServer) -> str:
    """How a client-credentials client authenticates at the token endpoint: it always has a
    secret, so "none" (the field's other choice) means sending it in the form."""
    method = server.oauth_token_endpoint_auth_method
    return method if method != "none" else "client_secret_post"


def _known_secrets(server: MCPServer, grant: MCPOAuthGrant | None) -> tuple[str, ...]:
    """Values masked in every message of a connection that uses this grant."""
    values = [decrypt(server.oauth_client_secret_encrypted)]
    if grant is not None and grant.tokens_encrypted:
        tokens = OAuthToken.model_validate_json(decrypt(grant.tokens_encrypted))
        values += [tokens.access_token, tokens.refresh_token or ""]
    if grant is not None and grant.client_info_encrypted:
        info = OAuthClientInformationFull.model_validate_json(decrypt(grant.client_info_encrypted))
        values.append(info.client_secret or "")
    return tuple(v for v in values if v)


def oauth_for(server: MCPServer):
    """`(auth, auth_key)` for a connection to `server` where nobody can consent (a Session's
    tool call, a refresh, a probe): `(None, "")` for a server without OAuth.

    Raises `AuthorizationRequired` at once when only an admin can help (never connected,
    revoked, expired without a refresh token); a provider that finds out later (the server
    refuses the tokens, the refresh is refused) raises it from its redirect handler, so the
    call ends with the same sentence instead of waiting for a person who is not there.
    `auth.redact_values` are the secrets the connection's messages must mask.
    """
    if not server.uses_oauth:
        return None, ""
    grant = MCPOAuthGrant.objects.for_tenant(server.tenant_id).filter(server_id=server.pk).first()
    status = authorization_status(server, grant)
    if status == AuthorizationStatus.NEEDS_CONSENT and server.auth_mode == MCPServer.AuthMode.OAUTH:
        lost = grant.lost_reason if grant is not None else ""
        why = f"lost its authorization ({lost})" if lost else "is not connected"
        raise AuthorizationRequired(needs_admin(server, why))
    if status == AuthorizationStatus.EXPIRED:
        raise AuthorizationRequired(needs_admin(server, "has an expired authorization and no refresh token"))
    storage = GrantStorage(server)

    async def nobody_to_ask(authorization_url: str) -> None:
        if auth.asked_for_more_scope:
            raise AuthorizationRequired(
                needs_admin(server, "asks for more permissions (scopes) than were granted")
            )
        # The stored authorization did not hold (refused token, refused refresh): drop it, so
        # the status says so, and end the call now.
        await storage.mark_consent_lost("the authorization server no longer accepts it")
        raise AuthorizationRequired(needs_admin(server, "lost its authorization"))

    async def no_callback() -> AuthorizationCodeResult:  # pragma: no cover - nobody_to_ask raised
        raise AuthorizationRequired(needs_admin(server, "lost its authorization"))

    auth = _provider(server, storage, nobody_to_ask, no_callback)
    auth.redact_values = _known_secrets(server, grant)
    # The grant's id changes when it is dropped and made again, its consent version when an
    # admin connects or revokes (or the consent is lost); a refresh changes neither.
    key = f"oauth:{grant.pk}:{grant.consent_version}" if grant is not None else f"oauth:none:{server.pk}"
    return auth, key


# --- connecting (admin) ---------------------------------------------------------------------


@dataclass
class ConnectStart:
    """What the Connect view does next: send the browser to `authorization_url`, or report
    `message` (the flow finished, or failed, without a browser)."""

    authorization_url: str = ""
    message: str = ""
    ok: bool = True


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "xagent-workspace", "version": "0.1.0"},
    },
}


async def _authorize(server: MCPServer, headers: dict[str, str], auth) -> int:
    """One MCP request through `auth`, so the provider runs its flow on the server's 401.

    The flow's own requests (discovery, registration, token) go through this client, hence
    through the outbound guard for a tenant-set server. The answer's status is returned.
    """
    # An operator's server is trusted at its own origin only: the endpoints its metadata names
    # (chosen by whoever runs that server) are checked like a tenant's.
    trusted = origin_of(server.url) if server.configured_by_operator else ""
    guard = async_guarded_transport(trusted=trusted)
    timeout = httpx2.Timeout(float(server.timeout_seconds or 30))
    async with httpx2.AsyncClient(headers=headers, timeout=timeout, transport=guard, auth=auth) as http:
        async with http.stream(
            "POST",
            server.url,
            json=INITIALIZE,
            headers={"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"},
        ) as response:
            return response.status_code


def _describe_failure(server: MCPServer, exc: BaseException) -> str:
    """A sentence for the admin; a tenant-set endpoint's answers are never repeated."""
    refused = refusal_in(exc)
    name = f"MCP server {server.name!r}"
    if refused is not None:
        return f"{name} was not contacted: {refused}"
    if isinstance(exc, MCPError):
        return str(exc)
    if isinstance(exc, ConsentTimedOut):
        return (
            f"{name}: the authorization page was not completed within {CONSENT_WAIT_SECONDS // 60} minutes."
        )
    if isinstance(exc, OAuthRegistrationError):
        what = "the authorization server refused to register this client"
    elif isinstance(exc, OAuthTokenError):
        what = "the authorization server refused the token request"
    elif isinstance(exc, OAuthFlowError):
        what = "the authorization flow failed"
    elif isinstance(exc, httpx2.ConnectError):
        what = "the server or its authorization server could not be reached"
    elif isinstance(exc, httpx2.TimeoutException):
        what = "the server or its authorization server did not answer in time"
    else:
        what = f"the authorization failed ({type(exc).__name__})"
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if detail and server.configured_by_operator:
        what = f"{what}: {detail[:300]}"
    return f"Connecting {name} failed: {what}."


def _redacted(server: MCPServer, text: str) -> str:
    grant = MCPOAuthGrant.objects.filter(server_id=server.pk).first()
    values = [*tenant_secret_values(server.tenant_id).values(), *_known_secrets(server, grant)]
    return Redactor(values).redact(text)


def connect_server(
    server: MCPServer, user, *, base_url: str = "", wait_seconds: float | None = None
) -> ConnectStart:
    """An admin's Connect: start the flow; return where to send the browser, or the outcome.

    Client credentials need no browser: the token is fetched and the tools refreshed here.
    For the authorization code flow a thread of this process runs the provider; it hands back
    the authorization URL (or its outcome, if the server needed no consent) within the
    server's timeout, then waits up to CONSENT_WAIT_SECONDS for the callback.
    """
    if not server.uses_oauth:
        return ConnectStart(message=f"MCP server {server.name!r} does not use OAuth.", ok=False)
    audit.record("mcp_oauth.connect_started", tenant_id=server.tenant_id, obj=server)
    handoff: Future[ConnectStart] = Future()
    thread = threading.Thread(
        target=_run_connect,
        args=(server.pk, user.pk, callback_url(base_url), handoff),
        name=f"mcp-oauth-{server.pk}",
        daemon=True,
    )
    thread.start()
    wait = wait_seconds if wait_seconds is not None else float(server.timeout_seconds or 30) * 2
    if server.auth_mode == MCPServer.AuthMode.CLIENT_CREDENTIALS:
        thread.join(wait)
    try:
        return handoff.result(timeout=wait)
    except FutureTimeout:
        return ConnectStart(
            message=f"MCP server {server.name!r} did not start the authorization in time; try again.",
            ok=False,
        )


def _run_connect(server_id: int, user_id: int, redirect_uri: str, handoff: Future) -> None:
    state_box: dict[str, str] = {}
    server = None
    try:
        server = MCPServer.objects.get(pk=server_id)
        storage = GrantStorage(server, connecting=True, user_id=user_id, redirect_uri=redirect_uri)
        secrets = tenant_secret_values(server.tenant_id)
        headers = {str(k): str(v) for k, v in resolve_refs(dict(server.headers or {}), secrets).items()}

        async def send_browser(authorization_url: str) -> None:
            if handoff.done():  # a second consent in one flow (step-up): the browser has left
                raise OAuthFlowError("the server asked for a second authorization; connect again")
            state = parse_qs(urlsplit(authorization_url).query).get("state", [""])[0]
            await _db(_open_attempt)(server, user_id, state)
            state_box["state"] = state
            handoff.set_result(ConnectStart(authorization_url=authorization_url))

        async def wait_for_code() -> AuthorizationCodeResult:
            deadline = time.monotonic() + CONSENT_WAIT_SECONDS
            while time.monotonic() < deadline:
                found = await _db(_take_code)(state_box["state"])
                if isinstance(found, AuthorizationCodeResult):
                    return found
                if found:  # the callback brought an error instead of a code
                    raise OAuthFlowError(found)
                await anyio.sleep(CALLBACK_POLL_SECONDS)
            raise ConsentTimedOut()

        auth = _provider(server, storage, send_browser, wait_for_code)
        # The flow may wait minutes for the admin; its database work runs in `_db` threads, so
        # this thread's own connection is not held meanwhile.
        connections.close_all()
        status = anyio.run(_authorize, server, headers, auth)
        if status in (401, 403):
            raise MCPError(f"MCP server {server.name!r} still refuses the authorization (HTTP {status}).")
        from .sync import refresh_server

        result = refresh_server(server)
        message = f"{server.name}: connected; {len(result.tools)} tool(s)."
        # This thread serves no request: the entry names the admin who pressed Connect.
        audit.record(
            "mcp_oauth.connected",
            tenant_id=server.tenant_id,
            obj=server,
            user=get_user_model()._default_manager.filter(pk=user_id).first(),
        )
        _finish_attempt(state_box.get("state"), MCPOAuthAttempt.Status.CONNECTED, message)
        if not handoff.done():
            handoff.set_result(ConnectStart(message=message))
    except Exception as exc:  # every failure ends the attempt with a sentence for the admin
        message = _describe_failure(server, exc) if server is not None else "The MCP server is gone."
        if server is not None:
            message = _redacted(server, message)
        logger.info("MCP OAuth connect of server %s failed: %s", server_id, message)
        _finish_attempt(state_box.get("state"), MCPOAuthAttempt.Status.FAILED, message)
        if not handoff.done():
            handoff.set_result(ConnectStart(message=message, ok=False))
    finally:
        connections.close_all()


def _open_attempt(server: MCPServer, user_id: int, state: str) -> None:
    # One consent at a time per server: an earlier attempt still waiting ends (its flow stops at
    # its next poll), so repeated Connects cannot pile up flows that each hold a thread.
    MCPOAuthAttempt.objects.filter(server=server, status=MCPOAuthAttempt.Status.WAITING).update(
        status=MCPOAuthAttempt.Status.FAILED, outcome="A newer Connect replaced this authorization."
    )
    MCPOAuthAttempt.objects.filter(server=server, expires_at__lt=timezone.now() - ATTEMPT_KEPT).delete()
    MCPOAuthAttempt.objects.create(
        tenant_id=server.tenant_id,
        server=server,
        started_by_id=user_id,
        state=state,
        expires_at=timezone.now() + timedelta(seconds=CONSENT_WAIT_SECONDS),
    )


def _take_code(state: str) -> AuthorizationCodeResult | str | None:
    """The code the callback stored, the error it reported instead, or None (not yet)."""
    attempt = MCPOAuthAttempt.objects.filter(state=state).first()
    if attempt is None:
        return "the authorization attempt is gone"
    if attempt.status == MCPOAuthAttempt.Status.WAITING:
        if attempt.expires_at <= timezone.now():
            return "the authorization expired before the authorization server answered"
        return None
    if attempt.status != MCPOAuthAttempt.Status.CODE_RECEIVED or not attempt.code_encrypted:
        return attempt.outcome or "the authorization did not complete"
    code = decrypt(attempt.code_encrypted)
    # The code is single-use: it leaves the row as soon as the flow has it.
    MCPOAuthAttempt.objects.filter(pk=attempt.pk).update(code_encrypted="")
    return AuthorizationCodeResult(code=code, state=state, iss=attempt.iss or None)


def _finish_attempt(state: str | None, status: str, message: str) -> None:
    if not state:
        return
    MCPOAuthAttempt.objects.filter(state=state).update(
        status=status, outcome=message[:500], code_encrypted=""
    )


# --- the callback ---------------------------------------------------------------------------


class CallbackRefused(Exception):
    """An unusable callback: `status` is the HTTP status of the page, `str()` its sentence."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def access_attempt(user, state: str) -> MCPOAuthAttempt:
    """The waiting attempt behind `state`, if `user` started it and still administers its
    tenant; else CallbackRefused (404 for an unknown state, another tenant's or another
    person's: nothing is said about it)."""
    from tenancy_app.access import admin_tenant_ids

    attempt = MCPOAuthAttempt.objects.filter(state=state).select_related("server").first() if state else None
    if (
        attempt is None
        or attempt.started_by_id != user.pk
        or not (user.is_superuser or attempt.tenant_id in set(admin_tenant_ids(user)))
    ):
        raise CallbackRefused("This authorization is unknown to this workspace, or not yours.", status=404)
    if attempt.status != MCPOAuthAttempt.Status.WAITING:
        raise CallbackRefused("This authorization was already used. Start again with Connect.")
    if attempt.expires_at <= timezone.now():
        raise CallbackRefused("This authorization expired. Start again with Connect.")
    return attempt


def do_receive_code(attempt: MCPOAuthAttempt, *, code: str, iss: str = "", error: str = "") -> None:
    """Hand the callback's code to the waiting flow (compare-and-set: one callback per state)."""
    if error:
        updated = MCPOAuthAttempt.objects.filter(pk=attempt.pk, status=MCPOAuthAttempt.Status.WAITING).update(
            status=MCPOAuthAttempt.Status.FAILED,
            outcome=f"The authorization server answered {error[:60]!r} instead of a code.",
        )
    elif not code:
        raise CallbackRefused("The authorization server sent no code.")
    else:
        updated = MCPOAuthAttempt.objects.filter(pk=attempt.pk, status=MCPOAuthAttempt.Status.WAITING).update(
            status=MCPOAuthAttempt.Status.CODE_RECEIVED, code_encrypted=encrypt(code), iss=iss[:500]
        )
    if not updated:
        raise CallbackRefused("This authorization was already used. Start again with Connect.")


def wait_for_outcome(attempt: MCPOAuthAttempt, seconds: float) -> MCPOAuthAttempt:
    """The attempt once its flow finished (connected/failed), or as it is after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        attempt.refresh_from_db(fields=["status", "outcome"])
        if attempt.status in (MCPOAuthAttempt.Status.CONNECTED, MCPOAuthAttempt.Status.FAILED):
            return attempt
        if time.monotonic() >= deadline:
            return attempt
        time.sleep(CALLBACK_POLL_SECONDS)


def set_client_secret(server: MCPServer, value: str) -> None:
    """Set (not save) the pre-registered client secret of `server`, encrypted."""
    server.oauth_client_secret_encrypted = encrypt(value)


# Changing any of these points the grant at another server or client: it is dropped, so a
# token is never sent where it was not issued for.
GRANT_BOUND_FIELDS = (
    "url",
    "auth_mode",
    "oauth_client_registration",
    "oauth_client_metadata_url",
    "oauth_client_id",
    "oauth_client_secret_encrypted",
    "oauth_issuer",
)


def forget_grant_if_moved(server: MCPServer) -> None:
    """Before saving `server`: delete its grant if a field the grant is bound to changed."""
    if server.pk is None:
        return
    stored = MCPServer.objects.filter(pk=server.pk).values(*GRANT_BOUND_FIELDS).first()
    if stored is not None and any(stored[name] != getattr(server, name) for name in GRANT_BOUND_FIELDS):
        MCPOAuthGrant.objects.filter(server_id=server.pk).delete()


# --- revoking ---------------------------------------------------------------------------

# The authorization server gets this long (at most) to confirm each revocation: an admin waits.
REVOCATION_TIMEOUT_SECONDS = 10


@dataclass(frozen=True)
class Revocation:
    """What a Revoke did: whether there were stored tokens (now deleted), and a sentence on
    what the authorization server was told (`upstream_ok` False: it may still honour them)."""

    had_tokens: bool
    upstream: str = ""
    upstream_ok: bool = True


def do_revoke(server: MCPServer, user) -> Revocation:
    """Drop the stored tokens of `server` (the registered client is kept), then ask the
    authorization server to revoke them too (RFC 7009), when its metadata named an endpoint.

    The local drop comes first and does not depend on the authorization server: the tokens are
    unusable by this workspace whatever it answers. The row is locked while the tokens are
    read and dropped, so a refresh in flight cannot store newer tokens that would go unrevoked
    (its compare-and-set then fails on the changed consent).
    """
    who = getattr(user, "username", "") or "an admin"
    with transaction.atomic():
        grant = (
            MCPOAuthGrant.objects.for_tenant(server.tenant_id)
            .select_for_update()
            .filter(server_id=server.pk)
            .exclude(tokens_encrypted="")
            .first()
        )
        if grant is None:
            return Revocation(had_tokens=False)
        tokens = OAuthToken.model_validate_json(decrypt(grant.tokens_encrypted))
        MCPOAuthGrant.objects.filter(pk=grant.pk).update(
            tokens_encrypted="",
            expires_at=None,
            has_refresh_token=False,
            consent_version=F("consent_version") + 1,
            token_version=F("token_version") + 1,
            refresh_lease_until=None,
            lost_reason=f"revoked by {who}"[:300],
            updated_at=timezone.now(),
        )
        audit.record("mcp_oauth.revoked", tenant_id=server.tenant_id, obj=server)
    upstream, ok = _revoke_upstream(server, grant, tokens)
    logger.info("MCP server %s: stored tokens revoked by %s; %s", server.pk, who, upstream)
    return Revocation(had_tokens=True, upstream=upstream, upstream_ok=ok)


def _revocation_client(server: MCPServer, grant: MCPOAuthGrant) -> tuple[str, str, str] | None:
    """(client_id, client_secret, auth method) the tokens were issued to, as at the token endpoint."""
    secret = decrypt(server.oauth_client_secret_encrypted)
    if server.auth_mode == MCPServer.AuthMode.CLIENT_CREDENTIALS:
        return server.oauth_client_id, secret, _client_credentials_auth_method(server)
    if server.oauth_client_registration == MCPServer.ClientRegistration.PRE_REGISTERED:
        return server.oauth_client_id, secret, server.oauth_token_endpoint_auth_method
    if not grant.client_info_encrypted:
        return None
    info = OAuthClientInformationFull.model_validate_json(decrypt(grant.client_info_encrypted))
    return info.client_id or "", info.client_secret or "", info.token_endpoint_auth_method or "none"


def _revoke_upstream(server: MCPServer, grant: MCPOAuthGrant, tokens: OAuthToken) -> tuple[str, bool]:
    """Ask the authorization server to revoke the refresh token, then the access token.
    Returns a sentence for the admin (never what the server answered beyond its status) and
    whether it confirmed every revocation."""
    endpoint = grant.revocation_endpoint
    if not endpoint:
        return "the authorization server names no revocation endpoint, so it was not told", False
    client = _revocation_client(server, grant)
    if client is None or not client[0]:
        return "no registered client is known to tell the authorization server with", False
    client_id, secret, method = client
    # client_secret is always present (empty unless sent by client_secret_post): the MCP SDK's
    # own revocation endpoint, which many servers deploy, answers 400 to a form without it.
    headers, auth_fields = {"Accept": "application/json"}, {"client_id": client_id, "client_secret": ""}
    if method == "client_secret_basic" and secret:
        pair = f"{quote(client_id, safe='')}:{quote(secret, safe='')}"  # RFC 6749 §2.3.1
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    elif method == "client_secret_post" and secret:
        auth_fields["client_secret"] = secret
    # An operator's server is trusted at its own origin only, as for its other OAuth endpoints.
    trusted = origin_of(server.url) if server.configured_by_operator else ""
    timeout = min(float(server.timeout_seconds or REVOCATION_TIMEOUT_SECONDS), REVOCATION_TIMEOUT_SECONDS)
    host = urlsplit(endpoint).hostname or endpoint
    revoked = []
    with httpx2.Client(transport=guarded_transport(trusted=trusted), timeout=timeout) as http:
        for hint, token in (("refresh_token", tokens.refresh_token), ("access_token", tokens.access_token)):
            if not token:
                continue
            try:
                response = http.post(
                    endpoint, data={"token": token, "token_type_hint": hint, **auth_fields}, headers=headers
                )
            except (httpx2.HTTPError, OutboundRefused) as exc:
                refused = refusal_in(exc)
                why = (
                    str(refused)
                    if refused is not None
                    else (
                        f"did not answer within {timeout:g} s"
                        if isinstance(exc, httpx2.TimeoutException)
                        else "was not reachable"
                    )
                )
                return f"the authorization server ({host}) {why}; it was not told", False
            if response.status_code != 200:
                return (
                    f"the authorization server ({host}) refused the revocation (HTTP {response.status_code})",
                    False,
                )
            revoked.append(hint.replace("_token", ""))
    return f"the authorization server ({host}) revoked the {' and '.join(revoked)} token(s)", True
