from django.conf import settings

from .access import SESSION_TENANT_KEY, list_memberships


def sign_in(request):
    """The login page's single sign-on button (tenancy_app/oidc.py)."""
    return {"oidc_enabled": bool(settings.XAGENT_OIDC_ISSUER), "oidc_name": settings.XAGENT_OIDC_NAME}


def current_tenant(request):
    """`current_membership` and `memberships` for the page header's tenant picker."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    memberships = list_memberships(user)
    chosen = request.session.get(SESSION_TENANT_KEY)
    current = next(
        (m for m in memberships if m.tenant.slug == chosen), memberships[0] if memberships else None
    )
    return {"memberships": memberships, "current_membership": current}
