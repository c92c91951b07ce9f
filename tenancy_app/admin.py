"""Django admin for tenancy, and `TenantScopedAdmin`, the base of every tenant-owned admin.

A superuser sees every tenant. A tenant admin (staff, owner/admin membership, not a
superuser) sees, adds and changes only rows of the tenants they administer; foreign-key
choices are narrowed the same way, so they cannot even pick another tenant's row.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from config.forms import BoundedJSONField

from . import audit
from .access import admin_tenant_ids
from .actions import do_issue_api_key, do_revoke_api_key
from .models import ApiKey, AuditEntry, Membership, Tenant, TenantOwnedModel


class TenantScopedAdmin(admin.ModelAdmin):
    # A tenant admin's JSON is input like any other: nesting past the limit is a form error.
    formfield_overrides = {models.JSONField: {"form_class": BoundedJSONField}}

    def _tenant_ids(self, request) -> list[int]:
        cache_attr = "_xagent_admin_tenant_ids"
        if not hasattr(request, cache_attr):
            setattr(request, cache_attr, admin_tenant_ids(request.user))
        return getattr(request, cache_attr)

    def _scoped(self, request, queryset):
        if request.user.is_superuser:
            return queryset
        model = queryset.model
        if model is Tenant:
            return queryset.filter(pk__in=self._tenant_ids(request))
        if issubclass(model, TenantOwnedModel):
            return queryset.filter(tenant_id__in=self._tenant_ids(request))
        tenant_field = _tenant_field(model)
        if tenant_field is not None:
            # Rows with an empty tenant are global (e.g. native tools): visible to every tenant admin,
            # changeable only by superusers.
            return queryset.filter(Q(tenant_id__in=self._tenant_ids(request)) | Q(tenant__isnull=True))
        return queryset

    def get_queryset(self, request):
        return self._scoped(request, super().get_queryset(request))

    def response_action(self, request, queryset):
        # Django filters the selection with the posted ids as they come: a crafted non-number
        # would be a 500. It selects nothing instead.
        try:
            return super().response_action(request, queryset)
        except (ValueError, ValidationError):
            self.message_user(request, "The selection was not valid; nothing was changed.", messages.WARNING)
            return None

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        field = super().formfield_for_foreignkey(db_field, request, **kwargs)
        if field is not None and hasattr(field, "queryset"):
            field.queryset = self._scoped(request, field.queryset)
            if field.queryset.model is Tenant and not request.user.is_superuser:
                tenant_ids = self._tenant_ids(request)
                if len(tenant_ids) == 1:
                    field.initial = tenant_ids[0]  # the only tenant this admin can pick: preselected
            if field.queryset.model is get_user_model() and not request.user.is_superuser:
                # People are offered only from the tenants this admin manages; new accounts are a superuser's call.
                field.queryset = field.queryset.filter(
                    memberships__tenant_id__in=self._tenant_ids(request)
                ).distinct()
        return field

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        field = super().formfield_for_manytomany(db_field, request, **kwargs)
        if field is not None and hasattr(field, "queryset"):
            field.queryset = self._scoped(request, field.queryset)
        return field

    # A tenant admin's rights come from their membership role, not Django's per-model permissions.
    def _is_tenant_admin(self, request) -> bool:
        return request.user.is_active and request.user.is_staff and bool(self._tenant_ids(request))

    def has_module_permission(self, request):
        return request.user.is_superuser or self._is_tenant_admin(request)

    def has_view_permission(self, request, obj=None):
        return request.user.is_superuser or self._is_tenant_admin(request)

    def has_add_permission(self, request):
        return request.user.is_superuser or self._is_tenant_admin(request)

    def has_change_permission(self, request, obj=None):
        if obj is not None and _is_global(obj):
            return request.user.is_superuser
        return request.user.is_superuser or self._is_tenant_admin(request)

    def has_delete_permission(self, request, obj=None):
        if obj is not None and _is_global(obj):
            return request.user.is_superuser
        return request.user.is_superuser or self._is_tenant_admin(request)

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if db_field.name == "tenant" and field is not None and not request.user.is_superuser:
            field.required = True  # a tenant admin cannot create global rows
        return field


class ReadOnlyTenantScopedAdmin(TenantScopedAdmin):
    """For evidence and audit rows: admins read them, only their owner's operations write them."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def _tenant_field(model):
    try:
        field = model._meta.get_field("tenant")
    except Exception:
        return None
    return field if getattr(field, "related_model", None) is Tenant else None


def _is_global(obj) -> bool:
    field = _tenant_field(type(obj))
    return field is not None and field.null and obj.tenant_id is None


@admin.register(Tenant)
class TenantAdmin(TenantScopedAdmin):
    list_display = ["slug", "name", "auto_resume_after_recovery", "password_sign_in", "created_at"]
    search_fields = ["slug", "name"]

    def has_add_permission(self, request):
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser

    def get_readonly_fields(self, request, obj=None):
        return [] if request.user.is_superuser else ["slug"]


@admin.register(Membership)
class MembershipAdmin(TenantScopedAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", ("tenant", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["user__username", "tenant__slug"]


class ApiKeyCreationForm(forms.ModelForm):
    class Meta:
        model = ApiKey
        fields = ["tenant", "user", "name"]

    def clean(self):
        cleaned = super().clean()
        tenant, user = cleaned.get("tenant"), cleaned.get("user")
        if tenant and user and not Membership.objects.for_tenant(tenant).filter(user=user).exists():
            raise forms.ValidationError(f"{user} is not a member of {tenant}.")
        return cleaned


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin):
    list_display = ["name", "prefix", "tenant", "user", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix", "user__username"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke_keys"]

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            kwargs["form"] = ApiKeyCreationForm
        return super().get_form(request, obj, **kwargs)

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["tenant", "user", "name"]
        return ["tenant", "user", "name", "prefix", "created_at", "last_used_at", "revoked_at"]

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj is None else [*self.readonly_fields, "tenant", "user"]

    def save_model(self, request, obj, form, change):
        if change:
            obj.save(update_fields=["name"])
            return
        key, plaintext = do_issue_api_key(obj.tenant, obj.user, obj.name)
        obj.pk = key.pk
        obj.refresh_from_db()
        messages.warning(
            request,
            f"API key for {key.user} in {key.tenant}: {plaintext} — copy it now, it will not be shown again.",
        )

    def has_delete_permission(self, request, obj=None):
        # Keys are revoked, not deleted: the row stays as audit of who had access.
        return False

    @admin.action(description="Revoke selected API keys")
    def revoke_keys(self, request, queryset):
        for key in queryset:
            do_revoke_api_key(key)
        self.message_user(request, f"Revoked {queryset.count()} key(s).")


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyTenantScopedAdmin):
    """The tenant's audit log: read-only, newest first, exportable. Nobody changes or deletes an
    entry here (nor anywhere in the product)."""

    list_display = ["at", "tenant", "actor", "action", "object_type", "object_repr", "ip"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter), "action", "object_type"]
    search_fields = ["actor_username", "action", "object_repr", "object_id"]
    date_hierarchy = "at"
    actions = ["export_csv", "export_jsonl"]

    def get_queryset(self, request):
        entries = super().get_queryset(request)
        # An operator's change to a global row is the operator's record, not a tenant's.
        return entries if request.user.is_superuser else entries.exclude(tenant__isnull=True)

    def get_actions(self, request):
        # Export only: the product offers no way to delete an entry, not even the bulk action.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    @admin.display(description="who")
    def actor(self, entry):
        actor = audit.actor_of(entry)
        who = actor.get("user", "the product")
        return f"{who} (key {actor['api_key']['name']})" if "api_key" in actor else who

    @admin.action(description="Export selected as CSV")
    def export_csv(self, request, queryset):
        return audit.export_response(queryset.order_by("-at", "-id"), "csv", "audit")

    @admin.action(description="Export selected as JSON Lines")
    def export_jsonl(self, request, queryset):
        return audit.export_response(queryset.order_by("-at", "-id"), "jsonl", "audit")
