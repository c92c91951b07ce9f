from django.urls import path
from rest_framework.routers import SimpleRouter

from .audit import AuditLogView
from .views import ApiKeyViewSet, MeView

router = SimpleRouter()
router.register("api-keys", ApiKeyViewSet, basename="api-key")

urlpatterns = [
    path("me/", MeView.as_view(), name="me"),
    path("audit/", AuditLogView.as_view(), name="audit"),
    *router.urls,
]
