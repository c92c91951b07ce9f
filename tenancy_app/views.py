from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from .access import SESSION_TENANT_KEY, resolve_membership


@login_required
@require_POST
def switch_tenant(request):
    """Remember which of the user's tenants the browser works in."""
    slug = request.POST.get("tenant", "")
    membership = resolve_membership(request.user, slug)
    if membership is None or membership.tenant.slug != slug:
        messages.error(request, "You are not a member of that tenant.")
    else:
        request.session[SESSION_TENANT_KEY] = slug
    next_url = request.POST.get("next") or "/"
    if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()}):
        next_url = "/"
    return redirect(next_url)
