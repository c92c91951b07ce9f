"""ASGI entry point: HTTP through Django, WebSockets through Channels (daphne serves both)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from .daphne_forms import leave_form_bodies_to_django  # noqa: E402

leave_form_bodies_to_django()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from sessions_app.consumers import SessionConsumer, SessionListConsumer  # noqa: E402
from tenancy_app.ws import RefusedConsumer, TenantAuthMiddlewareStack, WhoAmIConsumer  # noqa: E402

websocket_urlpatterns = [
    path("ws/whoami/", WhoAmIConsumer.as_asgi()),
    path("ws/sessions/", SessionListConsumer.as_asgi()),
    path("ws/sessions/<uuid:session_id>/", SessionConsumer.as_asgi()),
    # Last: any other path (or a malformed Session id) is refused at the handshake, where
    # URLRouter alone would raise and the server would answer 500.
    re_path(r"", RefusedConsumer.as_asgi()),
]

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": TenantAuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
    }
)
