from django.urls import re_path
from rest_framework.routers import SimpleRouter

from .longpoll import session_events
from .views import ApprovalViewSet, SessionViewSet

router = SimpleRouter()
router.register("sessions", SessionViewSet, basename="session")
router.register("approvals", ApprovalViewSet, basename="approval")

urlpatterns = [
    # Before the router: the long poll is an async view (no database connection while it waits).
    # It runs `SessionViewSet.events`, whose router entry below stays for the OpenAPI schema.
    re_path(r"^sessions/(?P<pk>[^/.]+)/events/$", session_events, name="session-events-longpoll"),
    *router.urls,
]
