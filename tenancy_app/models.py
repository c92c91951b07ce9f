"""Tenancy facts: tenants, who belongs to them with which role, and their API keys.

Every tenant-owned model of every app inherits `TenantOwnedModel`, whose manager
offers the one scoped read path, `for_tenant(tenant)` (ARCHITECTURE §8).
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from .choices import Role

slug_validator = RegexValidator(
    r"^[a-z0-9](?:[a-z0-9-]{0,48}[a-z0-9])?$",
    "Use 1-50 lowercase letters, digits or inner hyphens.",
)


class Tenant(models.Model):
    slug = models.CharField(max_length=50, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    # Off: this tenant's members sign in only through the OpenID Connect provider (a member of
    # several tenants keeps passwords while any of them allows them).
    password_sign_in = models.BooleanField(
        "password sign-in",
        default=True,
        help_text="Off: members sign in only with single sign-on (needs XAGENT_OIDC_ISSUER).",
    )
    # Bumped by every change of what configures this tenant's Sessions (models, tools, secrets,
    # policies: tenancy_app.versioning). A running slice caches that configuration and checks this
    # number in each step's fenced commit, so a change applies from the next model request.
    config_version = models.PositiveBigIntegerField(default=1, editable=False)
    # After a runner is lost (worker killed, restart), does the turn it was running go on by
    # itself? Off: that turn ends `interrupted` and waits for the next message (ARCHITECTURE §6).
    auto_resume_after_recovery = models.BooleanField(
        default=True,
        help_text="When a worker is lost mid-turn, continue the turn automatically after recovery. "
        "Off: the turn is closed as interrupted; queued messages are kept and start the next turn.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class TenantScopedQuerySet(models.QuerySet):
    def for_tenant(self, tenant: Tenant | int) -> TenantScopedQuerySet:
        tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
        return self.filter(tenant_id=tenant_id)


class TenantOwnedModel(models.Model):
    """Base of every row that belongs to one tenant."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        abstract = True


# Rows an operator may make global (tenant empty: every tenant sees them) or a tenant owns:
# `for_tenant` means "this tenant's rows plus the global ones" (tools, tool sets, Skills).
class TenantOrGlobalQuerySet(TenantScopedQuerySet):
    def for_tenant(self, tenant):
        tenant_id = tenant.pk if isinstance(tenant, Tenant) else tenant
        return self.filter(models.Q(tenant_id=tenant_id) | models.Q(tenant__isnull=True))


class TenantOrGlobalModel(models.Model):
    tenant = models.ForeignKey(
        Tenant,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="Empty: every tenant.",
    )

    objects = TenantOrGlobalQuerySet.as_manager()

    class Meta:
        abstract = True


class Membership(TenantOwnedModel):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__slug", "user__username"]
        constraints = [models.UniqueConstraint(fields=["tenant", "user"], name="unique_membership")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"


class ApiKey(TenantOwnedModel):
    """A bearer key for one user in one tenant. Only a hash of the secret is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    key_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class AuditEntryQuerySet(TenantScopedQuerySet):
    """Entries are written once and never changed: bulk updates and deletes are refused."""

    def update(self, **kwargs):
        raise PermissionError("audit entries cannot be changed")

    def delete(self):
        raise PermissionError("audit entries cannot be deleted")


class AuditEntry(models.Model):
    """One thing someone did to a tenant's configuration, access or work (tenancy_app/audit.py):
    who (a user, and the API key when one was used), what, to which object, the changed fields
    before and after (secrets redacted), when and from where. Append-only: the product offers no
    way to change or delete an entry. `tenant` empty: an operator's change to a global row."""

    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept as written: the entry still says who it was after the account or key is gone.
    actor_username = models.CharField(max_length=150, blank=True)
    actor_api_key = models.ForeignKey(
        "ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_api_key_name = models.CharField(max_length=100, blank=True)
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=100, blank=True)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    # {field: {"before": …, "after": …}}; a secret shows only that it changed ("[redacted]").
    changes = models.JSONField(default=dict, blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    user_agent = models.CharField(max_length=300, blank=True)

    objects = AuditEntryQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["tenant", "-at", "-id"], name="audit_tenant_at")]

    def __str__(self) -> str:
        return (
            f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_username or 'system'}: {self.action} {self.object_repr}"
        )

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise PermissionError("audit entries cannot be changed")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError("audit entries cannot be deleted")


class OIDCIdentity(models.Model):
    """Who a user is at the OpenID Connect provider (issuer + subject): how a returning user is
    recognised. Created at the first sign-in (tenancy_app/oidc.py); never matched by username
    or email, so nobody signs in to an existing local account by choosing its name at the IdP."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities"
    )
    issuer = models.CharField(max_length=300)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="unique_oidc_identity")]
        verbose_name = "OIDC identity"
        verbose_name_plural = "OIDC identities"

    def __str__(self) -> str:
        return f"{self.user} at {self.issuer}"
