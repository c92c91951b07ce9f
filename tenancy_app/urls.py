from django.urls import path

from . import views

app_name = "tenancy"
urlpatterns = [path("switch/", views.switch_tenant, name="switch")]
