from django.urls import re_path
from rest_framework.routers import SimpleRouter

from config.api import JSONOnlyNegotiation

from .files import FILE_PARSERS, FILE_RENDERERS
from .longpoll import session_events
from .memories import MemoryViewSet
from .pagination import HistoryPagination
from .usage import UsageView
from .views import ApprovalViewSet, SessionViewSet

router = SimpleRouter()
router.register("sessions", SessionViewSet, basename="session")
router.register("approvals", ApprovalViewSet, basename="approval")
router.register("memories", MemoryViewSet, basename="memory")

SESSION = r"^sessions/(?P<pk>[^/.]+)"

urlpatterns = [
    re_path(r"^usage/$", UsageView.as_view(), name="usage"),
    # Before the router: the long poll is an async view (no database connection while it waits).
    # It runs `SessionViewSet.events`, whose router entry below stays for the OpenAPI schema.
    re_path(rf"{SESSION}/events/$", session_events, name="session-events-longpoll"),
    # The workspace (sessions_app/api/files.py). `files/{path}` has no trailing slash: the
    # path is the file's own name.
    re_path(
        rf"{SESSION}/files/$",
        SessionViewSet.as_view(
            {"get": "files_list", "post": "files_upload"}, parser_classes=FILE_PARSERS, pagination_class=None
        ),
        name="session-files",
    ),
    re_path(
        rf"{SESSION}/files/(?P<path>[\s\S]+)$",
        SessionViewSet.as_view(
            {"get": "file_content", "delete": "file_delete"},
            renderer_classes=FILE_RENDERERS,
            content_negotiation_class=JSONOnlyNegotiation,
        ),
        name="session-file",
    ),
    re_path(
        rf"{SESSION}/previews/(?P<path>[\s\S]+)$",
        SessionViewSet.as_view({"get": "file_preview"}),
        name="session-file-preview",
    ),
    re_path(
        rf"{SESSION}/deliveries/$",
        SessionViewSet.as_view({"get": "deliveries_list"}, pagination_class=HistoryPagination),
        name="session-deliveries",
    ),
    re_path(
        rf"{SESSION}/deliveries/(?P<delivery_id>[0-9]+)/$",
        SessionViewSet.as_view({"get": "delivery_detail"}),
        name="session-delivery",
    ),
    re_path(
        rf"{SESSION}/model-calls/(?P<call_id>[0-9]+)/$",
        SessionViewSet.as_view({"get": "model_call_detail"}),
        name="session-model-call",
    ),
    re_path(
        rf"{SESSION}/input-requests/(?P<request_id>[0-9]+)/$",
        SessionViewSet.as_view({"get": "input_request_detail"}),
        name="session-input-request",
    ),
    re_path(
        rf"{SESSION}/input-requests/(?P<request_id>[0-9]+)/answer/$",
        SessionViewSet.as_view({"post": "input_request_answer"}),
        name="session-input-request-answer",
    ),
    *router.urls,
]
