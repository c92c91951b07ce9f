"""The tenant configuration version: one number per tenant that changes whenever something a
Session's runner caches for its slice changes (model configurations, tools, tool sets, MCP
servers, secrets, sandbox and approval policies).

Each app declares which of its models configure a tenant (`track_configuration` in its
`AppConfig.ready`); saving or deleting such a row bumps its tenant's version, and a global row
(no tenant) bumps every tenant's. Queryset `update()`/`delete()` bypass signals: code that
changes configuration in bulk calls `bump` itself.
"""

from __future__ import annotations

from django.db.models import F
from django.db.models.signals import m2m_changed, post_delete, post_save


def bump(tenant_id: int | None) -> None:
    from .models import Tenant

    tenants = Tenant.objects.all() if tenant_id is None else Tenant.objects.filter(pk=tenant_id)
    tenants.update(config_version=F("config_version") + 1)


def track_configuration(*models) -> None:
    for model in models:
        uid = f"tenant-config-{model._meta.label_lower}"
        post_save.connect(_changed, sender=model, dispatch_uid=uid, weak=False)
        post_delete.connect(_changed, sender=model, dispatch_uid=uid, weak=False)
        for field in model._meta.local_many_to_many:
            m2m_changed.connect(
                _changed, sender=field.remote_field.through, dispatch_uid=f"{uid}-{field.name}", weak=False
            )


def _changed(sender, instance, **kwargs) -> None:
    if kwargs.get("action", "post_").startswith("pre_"):
        return  # m2m_changed: count the change once, after it happened
    bump(getattr(instance, "tenant_id", None))
