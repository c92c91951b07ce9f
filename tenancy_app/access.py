"""The one tenant-scoped read path (ARCHITECTURE §8).

Which tenant a request acts for is decided here, for REST, browser pages, WebSockets and
admin alike: an API key's own tenant, else the logged-in user's chosen membership. Rows are
then read through that tenant's querysets (`for_tenant`, `TenantScopedViewSet`), so another
tenant's object is a 404.
"""

from __future__ import annotations

from .choices import ADMIN_ROLES
from .models import Membership

SESSION_TENANT_KEY = "xagent_tenant"


def list_memberships(user) -> list[Membership]:
    if not getattr(user, "is_authenticated", False):
        return []
    return list(Membership.objects.filter(user=user).select_related("tenant").order_by("created_at", "id"))


def resolve_membership(user, chosen_slug: str | None = None) -> Membership | None:
    """The membership a logged-in user acts through.

    `chosen_slug` (the tenant picked in the browser, or an `X-Tenant` header) wins when the
    user belongs to it; otherwise the user's first membership. None: not in any tenant.
    """
    memberships = list_memberships(user)
    if chosen_slug:
        for membership in memberships:
            if membership.tenant.slug == chosen_slug:
                return membership
    return memberships[0] if memberships else None


def admin_tenant_ids(user) -> list[int]:
    """Tenants whose rows `user` may administer in Django admin (owner/admin role)."""
    if not getattr(user, "is_authenticated", False):
        return []
    return list(
        Membership.objects.filter(user=user, role__in=list(ADMIN_ROLES)).values_list("tenant_id", flat=True)
    )
