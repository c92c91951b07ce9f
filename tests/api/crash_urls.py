"""The project's URLs plus two views that crash, to see what a 500 looks like (test_error_shape)."""

from django.urls import path
from rest_framework.views import APIView

from config.urls import handler400, handler403, handler404, handler500
from config.urls import urlpatterns as project_urlpatterns

__all__ = ["handler400", "handler403", "handler404", "handler500", "urlpatterns"]


class CrashingApiView(APIView):
    def get(self, request):
        raise RuntimeError("secret internal detail from a DRF view")


def crashing_django_view(request):
    raise RuntimeError("secret internal detail from a plain view")


urlpatterns = [
    path("api/v1/crash/drf/", CrashingApiView.as_view()),
    path("api/v1/crash/plain/", crashing_django_view),
    path("crash/page/", crashing_django_view),
    *project_urlpatterns,
]
