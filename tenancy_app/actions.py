"""Owner operations for tenancy facts. Every write to Tenant, Membership and ApiKey goes here."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from . import audit
from .choices import Role
from .models import ApiKey, Membership, Tenant
from .revocation import announce_key_revoked

API_KEY_PREFIX = "xak_"
# last_used_at is bookkeeping, not evidence: refreshing it at most once a minute keeps an
# API call from turning into a write on every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def _hash_secret(secret: str) -> str:
    # API keys carry 256 bits of randomness, so a fast hash is safe here (no dictionary to guess from).
    return hashlib.sha256(secret.encode()).hexdigest()


def do_create_tenant(slug: str, name: str = "") -> tuple[Tenant, bool]:
    """Create the tenant, or return the existing one with that slug (idempotent)."""
    tenant = Tenant(slug=slug, name=name or slug)
    tenant.full_clean(validate_unique=False)
    return Tenant.objects.get_or_create(slug=slug, defaults={"name": name or slug})


def do_set_membership(tenant: Tenant, user, role: str = Role.MEMBER) -> Membership:
    if role not in Role.values:
        raise ValidationError({"role": f"Unknown role {role!r}; use one of {', '.join(Role.values)}."})
    membership, _ = Membership.objects.update_or_create(tenant=tenant, user=user, defaults={"role": role})
    if role in (Role.OWNER, Role.ADMIN) and not user.is_staff:
        # Tenant owners and admins manage their tenant's rows in Django admin.
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    return membership


def do_create_user(username: str, tenant: Tenant, role: str = Role.MEMBER, password: str | None = None):
    """Create a user (or reuse one) and make them a member of `tenant`. Returns (user, created)."""
    User = get_user_model()
    with transaction.atomic():
        user, created = User.objects.get_or_create(username=username)
        if password is not None:
            user.set_password(password)
            user.save(update_fields=["password"])
        elif created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
        do_set_membership(tenant, user, role)
    return user, created


def do_issue_api_key(tenant: Tenant, user, name: str) -> tuple[ApiKey, str]:
    """Create a key and return it with its plaintext, which is never stored or shown again."""
    if not Membership.objects.for_tenant(tenant).filter(user=user).exists():
        raise ValidationError({"user": f"{user} is not a member of tenant {tenant.slug}."})
    prefix = secrets.token_hex(6)
    plaintext = f"{API_KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic():
        key = ApiKey.objects.create(
            tenant=tenant, user=user, name=name, prefix=prefix, key_hash=_hash_secret(plaintext)
        )
        audit.record(
            "api_key.created", tenant_id=tenant.pk, obj=key, changes={"user": {"after": user.get_username()}}
        )
    return key, plaintext


def do_revoke_api_key(key: ApiKey) -> ApiKey:
    """Revoke a key; revoking a revoked key changes nothing. The key's open WebSockets are
    closed and its long polls ended as soon as the revocation commits."""
    with transaction.atomic():
        revoked = ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        if revoked:
            announce_key_revoked(key.pk)
            audit.record("api_key.revoked", tenant_id=key.tenant_id, obj=key)
    key.refresh_from_db(fields=["revoked_at"])
    return key


def authenticate_api_key(plaintext: str) -> tuple[ApiKey, Membership] | None:
    """The active key matching `plaintext` and its owner's current membership, or None.

    A key stops working when it is revoked, its user is deactivated, or the user leaves the tenant.
    """
    if not plaintext.startswith(API_KEY_PREFIX):
        return None
    prefix, _, rest = plaintext[len(API_KEY_PREFIX) :].partition("_")
    if not prefix or not rest:
        return None
    key = (
        ApiKey.objects.select_related("tenant", "user")
        .filter(prefix=prefix, revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if key is None or not hmac.compare_digest(key.key_hash, _hash_secret(plaintext)):
        return None
    membership = Membership.objects.filter(tenant_id=key.tenant_id, user_id=key.user_id).first()
    if membership is None:
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    membership.tenant = key.tenant
    return key, membership
