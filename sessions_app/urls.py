from django.urls import path

from . import views

app_name = "workspace"
urlpatterns = [
    path("", views.home, name="home"),
    path("sessions/<uuid:session_id>/", views.session_detail, name="session"),
    path("memories/", views.memories, name="memories"),
    path("usage/", views.usage_page, name="usage"),
    path("favicon.ico", views.favicon, name="favicon"),
]
