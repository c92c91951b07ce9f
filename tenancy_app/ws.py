"""WebSocket authentication and client-frame hygiene for every consumer.

`TenantAuthMiddleware` sets `scope["user"]`, `scope["membership"]` and `scope["tenant"]` by the
same rules as the REST API: `?token=<api key>`, or the browser's session cookie, honoured only
when the Origin header is our own origin — scheme, host and port — as Django's CSRF check
decides it for a form post (cross-site WebSocket hijacking).

`TenantScopedConsumer` refuses a handshake without a tenant by closing before accepting (an
ASGI server such as daphne answers that with HTTP 403). An open socket is closed with 4401 as
soon as its key is revoked or its user leaves the tenant or is deactivated: it listens for the
revocation notice (tenancy_app.revocation), re-checks every client frame, and re-checks by
itself every RECHECK_INTERVAL_S in case a notice was lost. A client frame must be a JSON text
frame within the body limit and nesting depth of the REST API; anything else is answered
`{"type": "error", "error": {code, message}}` and the socket stays open.
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import parse_qs, urlsplit

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from channels.middleware import BaseMiddleware
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

from config.parsers import json_depth_exceeds, json_max_depth

from .access import SESSION_TENANT_KEY, resolve_membership
from .actions import authenticate_api_key
from .revocation import Principal

logger = logging.getLogger(__name__)

# Close codes in the application range (4000-4999), mirroring HTTP. A close before `accept`
# refuses the handshake: daphne answers it with HTTP 403 whatever the code; in-process
# (channels.testing) the code is visible.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


# A socket with no client frame for this long still learns that its access ended, even when the
# revocation notice was lost on the channel layer (which drops messages to a full channel).
RECHECK_INTERVAL_S = 60.0

DEFAULT_PORTS = {"http": 80, "https": 443}


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin1")
    return None


def _parse_origin(value: str) -> tuple[str, str, int] | None:
    """`(scheme, host, port)` of an origin such as `https://app.example.com:8443`; None for
    anything else (`null`, a path, another scheme)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in DEFAULT_PORTS or not host or parts.path not in ("", "/") or parts.query:
        return None
    return scheme, host, port or DEFAULT_PORTS[scheme]


def _own_origin(scope) -> tuple[str, str, int] | None:
    """The origin this handshake was sent to, as Django's `request.get_host()` and
    `request.is_secure()` would see it: the Host header (one of ALLOWED_HOSTS, else None) with
    its port, and https when the TLS proxy's SECURE_PROXY_SSL_HEADER says so or the socket is wss."""
    host = _header(scope, b"host")
    if settings.USE_X_FORWARDED_HOST:
        host = (_header(scope, b"x-forwarded-host") or "").split(",")[0].strip() or host
    if not host:
        return None
    domain, port = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]  # what Django's get_host() allows then
    if not domain or not validate_host(domain, allowed):
        return None
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    if settings.SECURE_PROXY_SSL_HEADER:
        meta_name, secure_value = settings.SECURE_PROXY_SSL_HEADER
        name = meta_name.removeprefix("HTTP_").replace("_", "-").lower().encode("latin1")
        forwarded = _header(scope, name)
        if forwarded is not None:
            scheme = "https" if forwarded.split(",")[0].strip() == secure_value else "http"
    return scheme, domain.strip("[]").lower(), int(port) if port else DEFAULT_PORTS[scheme]


def _trusted_origin(origin: tuple[str, str, int]) -> bool:
    """CSRF_TRUSTED_ORIGINS, read as Django's CSRF check reads it (`https://*.example.com`
    trusts every subdomain)."""
    scheme, host, port = origin
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        wildcard = "://*." in entry
        trusted = _parse_origin(entry.replace("://*.", "://", 1) if wildcard else entry)
        if trusted is None or trusted[0] != scheme or trusted[2] != port:
            continue
        matches = is_same_domain(host, f".{trusted[1]}") if wildcard else host == trusted[1]
        if matches:
            return True
    return False


def _origin_is_ours(scope) -> bool:
    """Did a page of our own site open this socket? Scheme, host and port must all match: another
    port on the same host is another origin (another application) and gets no cookie access."""
    value = _header(scope, b"origin")
    origin = _parse_origin(value) if value is not None else None
    if origin is None:
        return False
    return origin == _own_origin(scope) or _trusted_origin(origin)


def _session_membership(user, session):
    return resolve_membership(user, session.get(SESSION_TENANT_KEY) if session is not None else None)


class TenantAuthMiddleware(BaseMiddleware):
    async def __call__(self, scope, receive, send):
        scope = dict(scope)
        token = parse_qs(scope.get("query_string", b"").decode("latin1")).get("token", [""])[0]
        user, membership, key_id = AnonymousUser(), None, None
        if token:
            # A NUL cannot be part of a key, and PostgreSQL refuses to compare text holding one.
            found = None if "\x00" in token else await database_sync_to_async(authenticate_api_key)(token)
            if found is not None:
                key, membership = found
                user, key_id = key.user, key.pk
        else:
            cookie_user = scope.get("user")
            if cookie_user is not None and cookie_user.is_authenticated and _origin_is_ours(scope):
                user = cookie_user
                membership = await database_sync_to_async(_session_membership)(user, scope.get("session"))
        scope["user"] = user
        scope["membership"] = membership
        scope["api_key_id"] = key_id  # its socket listens for the key's revocation
        scope["tenant"] = membership.tenant if membership is not None else None
        return await super().__call__(scope, receive, send)


def TenantAuthMiddlewareStack(inner):
    return AuthMiddlewareStack(TenantAuthMiddleware(inner))


def parse_client_frame(text_data: str | None, bytes_data: bytes | None):
    """`(content, None)` for a well-formed JSON text frame, else `(None, (code, message))`."""
    if text_data is None:
        if bytes_data is not None:
            return None, ("malformed_frame", "Binary frames are not accepted: send JSON as a text frame.")
        return None, ("malformed_frame", "Empty frame: send a JSON object as a text frame.")
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is not None and len(text_data) > limit:
        return None, ("payload_too_large", f"The frame is larger than this server accepts ({limit} bytes).")
    depth = json_max_depth()
    if json_depth_exceeds(text_data, depth):
        return None, ("malformed_frame", f"The frame's JSON is nested deeper than {depth} levels.")
    try:
        return json.loads(text_data), None
    except (ValueError, RecursionError) as exc:
        return None, ("malformed_frame", f"The frame is not valid JSON: {exc}")


class TenantScopedConsumer(AsyncJsonWebsocketConsumer):
    """Base of every WebSocket consumer: refuses the connection unless a tenant is bound.

    Subclasses implement `tenant_connect()`, loading objects only through `for_tenant`
    and closing with CLOSE_NOT_FOUND for anything outside `self.tenant`, and `receive_json()`
    for client frames, which arrive parsed, from a still-authorized client.
    """

    access_ended = False
    _recheck: asyncio.Task | None = None

    async def connect(self):
        self.tenant = self.scope.get("tenant")
        self.membership = self.scope.get("membership")
        if self.tenant is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.principal = Principal.of(self.membership, self.scope.get("api_key_id"))
        for group in self.principal.groups():
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups.append(group)  # Channels leaves `self.groups` when the socket closes
        # Access that ended between the handshake's authentication and the subscription above
        # has no notice coming: check once more now.
        if not await database_sync_to_async(self.principal.still_authorized)():
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self.tenant_connect()

    async def tenant_connect(self):
        await self.accept()

    async def accept(self, subprotocol=None, headers=None):
        await super().accept(subprotocol, headers)
        if self._recheck is None:
            self._recheck = asyncio.ensure_future(self._recheck_periodically())

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:  # closed, disconnected or cancelled by the server: the re-check ends with the socket
            if self._recheck is not None:
                self._recheck.cancel()

    async def access_revoked(self, message):
        """A key of this socket was revoked or its user left the tenant (tenancy_app.revocation)."""
        await self._close_unless_authorized()

    async def _recheck_periodically(self):
        while not self.access_ended:
            await asyncio.sleep(RECHECK_INTERVAL_S)
            try:
                await self._close_unless_authorized()
            except Exception:  # a database hiccup: the next round, a notice or a frame checks again
                logger.warning("periodic access re-check failed in %s", type(self).__name__, exc_info=True)

    async def _close_unless_authorized(self) -> bool:
        """True while this socket's credentials still give access; else close it with 4401."""
        if self.access_ended:
            return False
        if await database_sync_to_async(self.principal.still_authorized)():
            return True
        if not self.access_ended:  # a notice and a frame may both have been checking
            self.access_ended = True
            await self.send_error(
                "not_authenticated", "These credentials no longer give access to this tenant."
            )
            await self.close(code=CLOSE_UNAUTHENTICATED)
        return False

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        if not await self._close_unless_authorized():
            return
        content, problem = parse_client_frame(text_data, bytes_data)
        if problem is not None:
            await self.send_error(*problem)
            return
        try:
            await self.receive_json(content, **kwargs)
        except Exception:
            # One bad frame must not take the socket down (a crash would close it with 1011).
            logger.exception("client frame failed in %s", type(self).__name__)
            await self.send_error("server_error", "The server hit an unexpected error; it has been logged.")

    async def send_error(self, code: str, message: str, **extra):
        """The CONTRACT error frame; `extra` (e.g. `approval_id`, `details`) joins the error object."""
        await self.send_json(
            {"seq": None, "type": "error", "error": {"code": code, "message": message, **extra}}
        )


class RefusedConsumer(AsyncWebsocketConsumer):
    """Every WebSocket path no route matches (unknown, or a malformed Session id): refused at the
    handshake (daphne answers 403), never a routing exception."""

    # An alias no settings define: `get_channel_layer` answers None, so a refused socket opens no
    # channel-layer subscription (no Redis round trips for junk, nothing to cancel at its end).
    channel_layer_alias = "refused-sockets-use-no-layer"

    async def connect(self):
        await self.close(code=CLOSE_NOT_FOUND)


class WhoAmIConsumer(TenantScopedConsumer):
    """`/ws/whoami/`: lets an integrator check that its WebSocket credentials work."""

    async def tenant_connect(self):
        await self.accept()
        await self.send_json(
            {
                "type": "hello",
                "user": self.scope["user"].get_username(),
                "tenant": self.tenant.slug,
                "role": self.membership.role,
            }
        )
