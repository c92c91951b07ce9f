"""WebSocket authentication: `?token=<api key>` or the browser's session cookie.

Sets `scope["user"]`, `scope["membership"]` and `scope["tenant"]` by the same rules as the
REST API. A session cookie is only honoured when the Origin header names one of our hosts
(cross-site WebSocket hijacking); token clients authenticate with the key itself.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.middleware import BaseMiddleware
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.http.request import validate_host

from .access import SESSION_TENANT_KEY, resolve_membership
from .actions import authenticate_api_key

# Close codes in the application range (4000-4999), mirroring HTTP.
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
        user, membership = AnonymousUser(), None
        if token:
            found = await database_sync_to_async(authenticate_api_key)(token)
            if found is not None:
                key, membership = found
                user = key.user
        else:
            cookie_user = scope.get("user")
            if cookie_user is not None and cookie_user.is_authenticated and _origin_is_ours(scope):
                user = cookie_user
                membership = await database_sync_to_async(_session_membership)(user, scope.get("session"))
        scope["user"] = user
        scope["membership"] = membership
        scope["tenant"] = membership.tenant if membership is not None else None
        return await super().__call__(scope, receive, send)


def TenantAuthMiddlewareStack(inner):
    return AuthMiddlewareStack(TenantAuthMiddleware(inner))


class TenantScopedConsumer(AsyncJsonWebsocketConsumer):
    """Base of every WebSocket consumer: refuses the connection unless a tenant is bound.

    Subclasses implement `tenant_connect()`, loading objects only through `for_tenant`
    and closing with CLOSE_NOT_FOUND for anything outside `self.tenant`.
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
