from django.urls import path
from rest_framework.routers import SimpleRouter

from .views import ApiKeyViewSet, MeView

router = SimpleRouter()
router.register("api-keys", ApiKeyViewSet, basename="api-key")

urlpatterns = [path("me/", MeView.as_view(), name="me"), *router.urls]
