"""Access that ends at once: revoking an API key, removing a member from a tenant or
deactivating a user closes that principal's open WebSockets (code 4401) and ends its long polls.

Every open socket and waiting long poll listens on its principal's channel-layer groups: one
per API key and one per user in a tenant. After the commit that ends access,
`{"type": "access.revoked"}` goes to those groups. The notice only says "check again": the
listener re-reads the database (`Principal.still_authorized`) and acts on what it finds, so a
spurious notice changes nothing, and one the bus loses is caught by the sockets' periodic
re-check (tenancy_app.ws).

A key is revoked by its owner operation (`actions.do_revoke_api_key`), which announces it.
Memberships and users are also deleted or changed by Django admin's generic views and by
cascades (deleting a user or a tenant), which no owner operation sees: the receivers below
announce those from the rows' own signals. They only announce; they write nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_save

from .models import ApiKey, Membership

logger = logging.getLogger(__name__)

ACCESS_REVOKED = {"type": "access.revoked"}  # handler `access_revoked`


def key_group(api_key_id: int) -> str:
    return f"access-key-{api_key_id}"


def member_group(tenant_id: int, user_id: int) -> str:
    return f"access-member-{tenant_id}-{user_id}"


@dataclass(frozen=True)
class Principal:
    """Who holds a socket or a long poll: a user's membership of a tenant, and the API key the
    caller authenticated with (None for the browser session)."""

    tenant_id: int
    user_id: int
    membership_id: int
    api_key_id: int | None = None

    @classmethod
    def of(cls, membership: Membership, api_key_id: int | None = None) -> Principal:
        return cls(membership.tenant_id, membership.user_id, membership.pk, api_key_id)

    @property
    def ident(self) -> str:
        """`key:<id>` or `user:<id>`, as `throttling.caller_ident` names the same caller."""
        return f"key:{self.api_key_id}" if self.api_key_id is not None else f"user:{self.user_id}"

    def groups(self) -> list[str]:
        groups = [member_group(self.tenant_id, self.user_id)]
        if self.api_key_id is not None:
            groups.append(key_group(self.api_key_id))
        return groups

    def still_authorized(self) -> bool:
        """One query: the same membership still joins this active user to this tenant and (for a
        key) the key is not revoked."""
        if self.api_key_id is not None:
            return ApiKey.objects.filter(
                pk=self.api_key_id,
                revoked_at__isnull=True,
                tenant_id=self.tenant_id,
                user_id=self.user_id,
                user__is_active=True,
                user__memberships__pk=self.membership_id,
                user__memberships__tenant_id=self.tenant_id,
            ).exists()
        return Membership.objects.filter(
            pk=self.membership_id, tenant_id=self.tenant_id, user_id=self.user_id, user__is_active=True
        ).exists()


def announce_key_revoked(api_key_id: int) -> None:
    _announce_after_commit([key_group(api_key_id)])


def announce_member_removed(tenant_id: int, user_id: int) -> None:
    _announce_after_commit([member_group(tenant_id, user_id)])


def announce_user_deactivated(user_id: int) -> None:
    tenant_ids = Membership.objects.filter(user_id=user_id).values_list("tenant_id", flat=True)
    _announce_after_commit([member_group(tenant_id, user_id) for tenant_id in tenant_ids])


def _announce_after_commit(groups: list[str]) -> None:
    if groups:
        transaction.on_commit(lambda: _send(groups))


def _send(groups: list[str]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(_send_all)(layer, groups)
    except Exception:
        # Access has ended in the database whatever happens here; open sockets re-check on their own.
        logger.warning("access revocation notice to %s failed", groups, exc_info=True)


async def _send_all(layer, groups: list[str]) -> None:
    for group in groups:
        await layer.group_send(group, dict(ACCESS_REVOKED))


# --- rows changed outside an owner operation ------------------------------------------------------


def _membership_deleted(sender, instance, **kwargs) -> None:
    announce_member_removed(instance.tenant_id, instance.user_id)


def _membership_saving(sender, instance, raw=False, update_fields=None, **kwargs) -> None:
    """Remembers the pair a membership joined before a save that may move it to another user or
    tenant (admin's change form); `_membership_saved` announces the move once it is written."""
    instance._access_before = None
    if raw or instance.pk is None:
        return
    if update_fields is not None and not {"tenant", "tenant_id", "user", "user_id"} & set(update_fields):
        return
    instance._access_before = (
        Membership.objects.filter(pk=instance.pk).values_list("tenant_id", "user_id").first()
    )


def _membership_saved(sender, instance, raw=False, **kwargs) -> None:
    # Announced here, not in pre_save: outside a transaction `on_commit` runs at once, and a
    # notice sent before the UPDATE lets a listener re-read the old row and wait on.
    before = getattr(instance, "_access_before", None)
    instance._access_before = None
    if before is not None and before != (instance.tenant_id, instance.user_id):
        announce_member_removed(*before)


def _user_saved(sender, instance, raw=False, update_fields=None, **kwargs) -> None:
    if raw or instance.is_active:
        return
    if update_fields is not None and "is_active" not in update_fields:
        return  # e.g. `last_login`: not the change that deactivated them
    announce_user_deactivated(instance.pk)


def connect_signals() -> None:
    """Called from TenancyConfig.ready."""
    post_delete.connect(_membership_deleted, sender=Membership, dispatch_uid="access-membership-deleted")
    pre_save.connect(_membership_saving, sender=Membership, dispatch_uid="access-membership-moving")
    post_save.connect(_membership_saved, sender=Membership, dispatch_uid="access-membership-moved")
    post_save.connect(_user_saved, sender=get_user_model(), dispatch_uid="access-user-deactivated")
