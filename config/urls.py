from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from tenancy_app import views as tenancy_views
from tools_app import views as tools_views

from . import views

admin.site.site_header = "xAgent workspace admin"
admin.site.site_title = "xAgent admin"

api_v1 = [
    path("", include("tenancy_app.api.urls")),
    path("", include("sessions_app.api.urls")),
    path("", include("tools_app.api.urls")),
    path("", include("skills_app.api.urls")),
    path("healthz", views.healthz),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
]

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("mcp/oauth/callback/", tools_views.oauth_callback, name="mcp_oauth_callback"),
    path("accounts/oidc/login/", tenancy_views.oidc_login, name="oidc_login"),
    path("accounts/oidc/callback/", tenancy_views.oidc_callback, name="oidc_callback"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include(api_v1)),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("tenants/", include("tenancy_app.urls")),
    path("", include("sessions_app.urls")),
]

handler400 = "config.views.bad_request"
handler403 = "config.views.permission_denied"
handler404 = "config.views.page_not_found"
handler500 = "config.views.server_error"
