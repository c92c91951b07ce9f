import logging

import requests
from authlib.common.errors import AuthlibBaseError
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST
from joserfc.errors import JoseError

from . import oidc
from .access import SESSION_TENANT_KEY, resolve_membership

logger = logging.getLogger(__name__)


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


SSO_BACKEND = "tenancy_app.backends.SingleSignOnBackend"


def oidc_login(request):
    """ "Sign in with …": to the provider (state, nonce and PKCE verifier kept in the session)."""
    if not oidc.enabled():
        raise Http404("Single sign-on is not configured.")
    try:
        return oidc.client().authorize_redirect(request, request.build_absolute_uri(reverse("oidc_callback")))
    except (requests.RequestException, ValueError, KeyError) as exc:
        logger.warning("OIDC provider unreachable: %s", exc)
        return _sign_in_failed(request, UNREACHABLE, status=503)


def oidc_callback(request):
    """Back from the provider: check state, exchange the code (with the PKCE verifier), verify the
    ID token (signature, issuer, audience, expiry, nonce); then sign in the user it names."""
    if not oidc.enabled():
        raise Http404("Single sign-on is not configured.")
    if request.GET.get("error"):
        return _sign_in_failed(
            request,
            f"The sign-in provider refused: {request.GET.get('error_description') or request.GET['error']}.",
        )
    try:
        token = oidc.client().authorize_access_token(request)
        claims = dict(token.get("userinfo") or {})
        if not claims:
            raise oidc.SignInRefused("The sign-in provider sent no ID token.")
        user = oidc.sign_in(claims)
    except requests.RequestException as exc:
        logger.warning("OIDC provider unreachable at the callback: %s", exc)
        return _sign_in_failed(request, UNREACHABLE, status=503)
    except (AuthlibBaseError, JoseError) as exc:  # state, code exchange, ID token (signature, claims)
        logger.warning("OIDC sign-in refused: %s", exc)
        return _sign_in_failed(
            request,
            "The sign-in could not be verified (it may have expired or been tampered with). Please try again.",
        )
    except oidc.SignInRefused as exc:
        return _sign_in_failed(request, str(exc), status=403)
    login(request, user, backend=SSO_BACKEND)
    return redirect("/")


UNREACHABLE = "The sign-in provider cannot be reached right now. Try again in a moment, or sign in with a password if your organisation allows it."


def _sign_in_failed(request, message: str, *, status: int = 400):
    return render(request, "registration/sign_in_failed.html", {"message": message}, status=status)
