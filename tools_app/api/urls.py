from rest_framework.routers import SimpleRouter

from .views import ToolViewSet

router = SimpleRouter()
router.register("tools", ToolViewSet, basename="tool")

urlpatterns = router.urls
