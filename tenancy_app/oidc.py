"""Sign-in with an OpenID Connect provider, configured for the deployment from the environment
(XAGENT_OIDC_*; docs/configuration.md).

The protocol is Authlib's: the authorization code flow with PKCE (S256), `state` kept in the
browser session and checked at the callback, a `nonce` checked in the ID token, and the ID token
verified against the provider's published keys (signature, issuer, audience, expiry). What
happens after is the product's (`sign_in`): the provider's (issuer, subject) names the user —
created at the first sign-in — and the groups claim decides, by the operator's rules, which
tenants the user belongs to with which role. A group the provider no longer lists removes the
membership it gave, at the next sign-in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from authlib.integrations.django_client import OAuth
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone

from . import audit
from .actions import do_set_membership
from .choices import Role
from .models import Membership, OIDCIdentity, Tenant

logger = logging.getLogger(__name__)

ROLE_RANK = {Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}
_clients: dict[tuple, object] = {}


class SignInRefused(Exception):
    """The provider vouched for someone this deployment has no place for (a sentence for them)."""


def enabled() -> bool:
    return bool(settings.XAGENT_OIDC_ISSUER)


def client():
    """The provider's client as configured now (its metadata is read from the issuer on first
    use, then kept: one per configuration, so a changed setting takes a new one)."""
    if not enabled():
        raise ImproperlyConfigured("XAGENT_OIDC_ISSUER is not set")
    key = (
        settings.XAGENT_OIDC_ISSUER,
        settings.XAGENT_OIDC_CLIENT_ID,
        settings.XAGENT_OIDC_CLIENT_SECRET,
        settings.XAGENT_OIDC_SCOPES,
    )
    if key not in _clients:
        _clients[key] = _register(OAuth())
    return _clients[key]


def _register(registry: OAuth):
    return registry.register(
        "idp",
        client_id=settings.XAGENT_OIDC_CLIENT_ID,
        client_secret=settings.XAGENT_OIDC_CLIENT_SECRET,
        server_metadata_url=f"{settings.XAGENT_OIDC_ISSUER}/.well-known/openid-configuration",
        client_kwargs={
            "scope": settings.XAGENT_OIDC_SCOPES,
            "code_challenge_method": "S256",
            "timeout": settings.XAGENT_OIDC_TIMEOUT,
        },
    )


@dataclass(frozen=True)
class RoleRule:
    group: str
    tenant_slug: str
    role: str


def role_rules(text: str | None = None) -> list[RoleRule]:
    """XAGENT_OIDC_ROLE_RULES: "group=tenant-slug:role, …"."""
    rules = []
    for part in (settings.XAGENT_OIDC_ROLE_RULES if text is None else text).split(","):
        part = part.strip()
        if not part:
            continue
        group, _, target = part.partition("=")
        slug, _, role = target.partition(":")
        role = role.strip() or Role.MEMBER
        if not group.strip() or not slug.strip() or role not in ROLE_RANK:
            raise ImproperlyConfigured(
                f"XAGENT_OIDC_ROLE_RULES: {part!r} is not group=tenant-slug:role (owner, admin or member)"
            )
        rules.append(RoleRule(group.strip(), slug.strip(), role))
    return rules


def granted_roles(groups, rules: list[RoleRule]) -> dict[str, str]:
    """{tenant slug: role} the groups give (the highest role per tenant)."""
    names = {str(g) for g in groups} if isinstance(groups, list | tuple) else set()
    roles: dict[str, str] = {}
    for rule in rules:
        if rule.group in names and ROLE_RANK[rule.role] > ROLE_RANK.get(roles.get(rule.tenant_slug), 0):
            roles[rule.tenant_slug] = rule.role
    return roles


def sign_in(claims: dict):
    """The user the provider's verified `claims` name, created at the first sign-in, with the
    memberships their groups give now. Raises SignInRefused when no rule gives them a tenant."""
    issuer, subject = settings.XAGENT_OIDC_ISSUER, str(claims.get("sub") or "")
    if not subject:
        raise SignInRefused("The sign-in provider did not say who you are (no subject).")
    rules = role_rules()
    roles = granted_roles(claims.get(settings.XAGENT_OIDC_GROUPS_CLAIM), rules)
    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in={rule.tenant_slug for rule in rules})}
    if not any(slug in tenants for slug in roles):
        raise SignInRefused(
            "You signed in at the provider, but none of your groups gives you a workspace here. "
            "Ask an administrator to add you to a group that maps to a tenant."
        )
    with transaction.atomic():
        identity = OIDCIdentity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
        if identity is None:
            user = _new_user(claims)
            identity = OIDCIdentity.objects.create(user=user, issuer=issuer, subject=subject)
            audit_created = True
        else:
            audit_created = False
        user = identity.user
        if not user.is_active:
            raise SignInRefused("This account is deactivated.")
        _sync_memberships(user, roles, tenants)
        OIDCIdentity.objects.filter(pk=identity.pk).update(last_sign_in_at=timezone.now())
        if audit_created:
            for slug in roles:
                if slug in tenants:
                    audit.record("auth.user_provisioned", tenant_id=tenants[slug].pk, obj=user, user=user)
    return user


def _new_user(claims: dict):
    """A new account named after the provider's username (or email); a name already taken gets
    a number: the provider never signs anyone in to an account it did not create."""
    User = get_user_model()
    wanted = str(claims.get("preferred_username") or str(claims.get("email") or "").split("@")[0] or "user")
    base = "".join(c for c in wanted if c.isalnum() or c in "._-")[:140] or "user"
    name, n = base, 1
    while User.objects.filter(username=name).exists():
        n += 1
        name = f"{base}-{n}"
    user = User(username=name, email=str(claims.get("email") or "")[:254])
    user.set_unusable_password()  # signs in through the provider only
    user.save()
    return user


def _sync_memberships(user, roles: dict[str, str], tenants: dict[str, Tenant]) -> None:
    """Memberships in the tenants the rules speak of follow the groups; others are left alone."""
    for slug, tenant in tenants.items():
        role = roles.get(slug)
        current = Membership.objects.for_tenant(tenant).filter(user=user).first()
        if role is None:
            if current is not None:
                current.delete()  # the group is gone: so is the membership (audited)
        elif current is None or current.role != role:
            do_set_membership(tenant, user, role)


def password_sign_in_allowed(user) -> bool:
    """Whether `user` may sign in with a password: not when every tenant they belong to turned
    password sign-in off (a user in no tenant yet, e.g. an operator, may)."""
    flags = list(Membership.objects.filter(user=user).values_list("tenant__password_sign_in", flat=True))
    return not flags or any(flags)
