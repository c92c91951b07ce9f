from rest_framework.routers import SimpleRouter

from .views import ApprovalViewSet, SessionViewSet

router = SimpleRouter()
router.register("sessions", SessionViewSet, basename="session")
router.register("approvals", ApprovalViewSet, basename="approval")

urlpatterns = router.urls
