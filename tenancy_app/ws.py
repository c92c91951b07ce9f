"""WebSocket authentication and client-frame hygiene for every consumer.

`TenantAuthMiddleware` sets `scope["user"]`, `scope["membership"]` and `scope["tenant"]` by the
same rules as the REST API: `?token=<api key>`, or the browser's session cookie, honoured only
when the Origin header names one of our hosts (cross-site WebSocket hijacking).

`TenantScopedConsumer` refuses a handshake without a tenant by closing before accepting (an
ASGI server such as daphne answers that with HTTP 403); once open, every client frame first
re-checks that the key is not revoked and the user still belongs to the tenant (else close
4401), then must be a JSON text frame within the body limit and nesting depth of the REST API;
anything else is answered `{"type": "error", "error": {code, message}}` and the socket stays open.
"""

from __future__ import annotations

import json
import logging
from urllib.parse import parse_qs, urlparse

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from channels.middleware import BaseMiddleware
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.http.request import validate_host

from config.parsers import json_depth_exceeds, json_max_depth

from .access import SESSION_TENANT_KEY, resolve_membership
from .actions import authenticate_api_key
from .models import ApiKey, Membership

logger = logging.getLogger(__name__)

# Close codes in the application range (4000-4999), mirroring HTTP. A close before `accept`
# refuses the handshake: daphne answers it with HTTP 403 whatever the code; in-process
# (channels.testing) the code is visible.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


def _origin_is_ours(scope) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"origin":
            host = urlparse(value.decode("latin1")).hostname or ""
            return validate_host(host, settings.ALLOWED_HOSTS)
    return False


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
        scope["api_key_id"] = key_id  # re-checked on every client frame (revocation)
        scope["tenant"] = membership.tenant if membership is not None else None
        return await super().__call__(scope, receive, send)


def TenantAuthMiddlewareStack(inner):
    return AuthMiddlewareStack(TenantAuthMiddleware(inner))


def _still_authorized(membership_id: int, key_id: int | None) -> bool:
    """One query: the membership still exists, its user is active and (for token sockets) the key
    is not revoked."""
    if key_id is not None:
        return ApiKey.objects.filter(
            pk=key_id, revoked_at__isnull=True, user__is_active=True, user__memberships__pk=membership_id
        ).exists()
    return Membership.objects.filter(pk=membership_id, user__is_active=True).exists()


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

    async def connect(self):
        self.tenant = self.scope.get("tenant")
        self.membership = self.scope.get("membership")
        if self.tenant is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self.tenant_connect()

    async def tenant_connect(self):
        await self.accept()

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        authorized = await database_sync_to_async(_still_authorized)(
            self.membership.pk, self.scope.get("api_key_id")
        )
        if not authorized:
            await self.send_error(
                "not_authenticated", "These credentials no longer give access to this tenant."
            )
            await self.close(code=CLOSE_UNAUTHENTICATED)
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
