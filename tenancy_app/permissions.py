from rest_framework import exceptions, permissions

from .access import SESSION_TENANT_KEY, resolve_membership
from .choices import ADMIN_ROLES

TENANT_HEADER = "HTTP_X_TENANT"


def bind_request_tenant(request):
    """Attach `request.tenant` and `request.membership`; return the membership or None.

    API-key requests were bound by the authenticator. A browser session uses the tenant
    picked in the workspace (or an `X-Tenant: <slug>` header), else its first membership.
    """
    django_request = getattr(request, "_request", request)
    membership = getattr(django_request, "tenant_membership", None)
    if membership is None and request.user.is_authenticated:
        chosen = request.META.get(TENANT_HEADER) or request.session.get(SESSION_TENANT_KEY)
        membership = resolve_membership(request.user, chosen)
        django_request.tenant_membership = membership
    request.membership = membership
    request.tenant = membership.tenant if membership else None
    return membership


class IsTenantMember(permissions.BasePermission):
    """Every API route acts inside exactly one tenant the caller belongs to."""

    message = "Your account is not a member of any tenant."

    def has_permission(self, request, view):
        if not request.user or not request.user.is_authenticated:
            raise exceptions.NotAuthenticated()
        return bind_request_tenant(request) is not None


class IsTenantAdmin(IsTenantMember):
    message = "Only owners and admins of this tenant may do that."

    def has_permission(self, request, view):
        return super().has_permission(request, view) and request.membership.role in ADMIN_ROLES
