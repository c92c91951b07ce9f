"""One audit log: who did what to a tenant's configuration, access and work, when and from where
(`AuditEntry`, append-only).

Entries are written by the owners of the facts, never by views:
- configuration and access models record their own creations, changes and deletions
  (`track_changes`, declared in each app's `ready` beside `track_configuration`), with the
  changed fields before and after; secrets show only that they changed;
- operations that change no such row record themselves (`record`): sign-in and failed sign-in
  (Django's auth signals), approval decisions, goal runs started and stopped, Skill exports.

Who and from where come from the request being served: `AuditContextMiddleware` keeps it for the
request, the API key authenticator adds the key. A row change made outside any request (a
worker's bookkeeping, a health check) is the system's, not an admin's change, and is not
recorded; an operation that records itself is, with no actor.
"""

from __future__ import annotations

import contextvars
import csv
import io
import json
import logging
from contextlib import contextmanager

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.db import models
from django.db.models.signals import post_delete, post_save, pre_save
from django.http import StreamingHttpResponse

from .models import ApiKey, AuditEntry, Tenant

logger = logging.getLogger(__name__)

REDACTED = "[redacted]"
# Fields never worth an entry: bookkeeping the product itself keeps up to date.
IGNORED_FIELDS = {"updated_at", "last_used_at", "config_version", "token_version", "created_at"}
# A field whose name says it holds a secret is shown only as changed (`max_tokens` is a number,
# `password_sign_in` a setting).
SECRET_MARKERS = ("secret", "encrypted", "credential")
SECRET_NAMES = ("password", "token", "api_key")
SECRET_SUFFIXES = ("_password", "_token", "_key", "_hash")
# In JSON fields (headers, environments), keys like these hold secrets too.
SECRET_KEYS = ("authorization", "secret", "password", "token", "key", "cookie", "credential")
MAX_VALUE_CHARS = 500

_request = contextvars.ContextVar("audit_request", default=None)
# Inside an operation that records itself (a Skill import), its row changes are not entries of
# their own.
_recorded_by_operation = contextvars.ContextVar("audit_recorded_by_operation", default=False)


class AuditContextMiddleware:
    """Keeps the request being served for the audit log (its user, API key, address, agent)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        token = _request.set(request)
        try:
            return self.get_response(request)
        finally:
            _request.reset(token)

    async def _acall(self, request):
        token = _request.set(request)
        try:
            return await self.get_response(request)
        finally:
            _request.reset(token)


@contextmanager
def acting(request):
    """For code that serves a request outside the middleware (a WebSocket frame, a test)."""
    token = _request.set(request)
    try:
        yield
    finally:
        _request.reset(token)


def current_request():
    return _request.get()


@contextmanager
def as_one_entry():
    """The row changes inside are one operation's, which records itself: no entry of their own."""
    token = _recorded_by_operation.set(True)
    try:
        yield
    finally:
        _recorded_by_operation.reset(token)


def _tracking() -> bool:
    return current_request() is not None and not _recorded_by_operation.get()


def _actor(request) -> dict:
    if request is None:
        return {}
    user = getattr(request, "user", None)
    key = getattr(request, "audit_api_key", None)
    meta = getattr(request, "META", None) or {}
    # REMOTE_ADDR as the server saw it (behind a proxy, configure the proxy to set it).
    actor = {"ip": meta.get("REMOTE_ADDR") or None, "user_agent": (meta.get("HTTP_USER_AGENT") or "")[:300]}
    if user is not None and getattr(user, "is_authenticated", False):
        actor["actor_user_id"] = user.pk
        actor["actor_username"] = user.get_username()
    if isinstance(key, ApiKey):
        actor["actor_api_key_id"] = key.pk
        actor["actor_api_key_name"] = key.name[:100]
    return actor


def record(
    action: str,
    *,
    tenant_id: int | None,
    obj: models.Model | None = None,
    object_type: str = "",
    object_id: str = "",
    object_repr: str = "",
    changes: dict | None = None,
    user=None,
    request=None,
    by_product: bool = False,
) -> AuditEntry:
    """Append one entry. `user`: who acted when it is not the request's user (a sign-in happens
    before the request has one). `by_product`: the product acted on its own (seeding a default),
    whatever request it happened in: no actor."""
    request = request if request is not None else current_request()
    actor = {} if by_product else _actor(request)
    if user is not None:
        actor["actor_user_id"], actor["actor_username"] = user.pk, user.get_username()
    if obj is not None:
        object_type = object_type or obj._meta.label_lower
        object_id = object_id or str(obj.pk)
        object_repr = object_repr or str(obj)
    return AuditEntry.objects.create(
        tenant_id=tenant_id,
        action=action,
        object_type=object_type,
        object_id=object_id,
        object_repr=object_repr[:200],
        changes=changes or {},
        **actor,
    )


# --- row changes -------------------------------------------------------------------------------


def track_changes(*tracked: type[models.Model], actions: dict | None = None) -> None:
    """Record every create, change and delete of these models made while serving a request.
    `actions`: {model: function(instance, created, changes) -> action name or None} for models
    whose changes have names of their own (an API key's revocation)."""
    for model in tracked:
        uid = f"audit-{model._meta.label_lower}"
        name_of = (actions or {}).get(model)
        pre_save.connect(_remember_before, sender=model, dispatch_uid=uid, weak=False)
        post_save.connect(_saved(name_of), sender=model, dispatch_uid=uid, weak=False)
        post_delete.connect(_deleted, sender=model, dispatch_uid=uid, weak=False)


def _tenant_of(instance) -> int | None:
    if isinstance(instance, Tenant):
        return instance.pk  # a tenant's own settings are its log's
    return getattr(instance, "tenant_id", None)


def _label(instance) -> str:
    return instance._meta.model_name


def _remember_before(sender, instance, raw=False, **kwargs):
    if raw or not _tracking() or instance.pk is None or instance._state.adding:
        return
    before = sender._default_manager.filter(pk=instance.pk).values().first()
    instance._audit_before = before


def _saved(name_of):
    def handler(sender, instance, created, raw=False, **kwargs):
        if raw or not _tracking():
            return
        before = {} if created else getattr(instance, "_audit_before", None) or {}
        instance._audit_before = None
        changes = _changes(instance, before, created)
        if not created and not changes:
            return  # only bookkeeping changed
        action = name_of(instance, created, changes) if name_of else None
        action = action or f"{_label(instance)}.{'created' if created else 'changed'}"
        record(action, tenant_id=_tenant_of(instance), obj=instance, changes=changes)

    return handler


def _deleted(sender, instance, **kwargs):
    if not _tracking():
        return
    record(f"{_label(instance)}.deleted", tenant_id=_tenant_of(instance), obj=instance)


def _changes(instance, before: dict, created: bool) -> dict:
    changes = {}
    for field in instance._meta.concrete_fields:
        if field.primary_key or field.name in IGNORED_FIELDS:
            continue
        old = before.get(field.attname) if not created else None
        new = getattr(instance, field.attname)
        if not created and old == new:
            continue
        if created and new in (None, "", [], {}):
            continue
        if _is_secret(field.name):
            changes[field.name] = {"before": REDACTED if old else None, "after": REDACTED if new else None}
        else:
            changes[field.name] = {"before": _shown(old), "after": _shown(new)}
    return changes


def _is_secret(name: str) -> bool:
    name = name.lower()
    return (
        any(marker in name for marker in SECRET_MARKERS) or name.endswith(SECRET_SUFFIXES) or name == "token"
    )


def _shown(value):
    """A field's value as the entry shows it: JSON-safe, short, secret keys of a mapping hidden."""
    if isinstance(value, dict):
        value = {
            k: (REDACTED if any(m in str(k).lower() for m in SECRET_KEYS) else _shown(v))
            for k, v in value.items()
        }
        return value
    if isinstance(value, list):
        return [_shown(v) for v in value[:50]]
    try:
        json.dumps(value)
    except TypeError:
        value = str(value)
    if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
        value = value[:MAX_VALUE_CHARS] + "…"
    return value


# --- sign-in -----------------------------------------------------------------------------------


def signed_in(sender, request, user, **kwargs):
    for tenant_id in user.memberships.values_list("tenant_id", flat=True):
        record("auth.signed_in", tenant_id=tenant_id, obj=user, user=user, request=request)


def sign_in_failed(sender, credentials, request=None, **kwargs):
    """A failed sign-in for an existing account goes to each of its tenants' logs; the password
    tried is never kept. An unknown username belongs to no tenant (django-axes counts those)."""
    from django.contrib.auth import get_user_model

    username = str((credentials or {}).get("username", ""))[:150]
    user = get_user_model()._default_manager.filter(username=username).first()
    if user is None:
        logger.info("failed sign-in for an unknown username")
        return
    for tenant_id in user.memberships.values_list("tenant_id", flat=True):
        # Nobody signed in: the entry names the account tried, not an actor.
        record("auth.sign_in_failed", tenant_id=tenant_id, obj=user, request=request)


def membership_action(membership, created: bool, changes: dict) -> str:
    if created:
        return "membership.created"
    return "membership.role_changed" if "role" in changes else "membership.changed"


def connect_signals() -> None:
    from django.contrib.auth.signals import user_logged_in, user_login_failed

    from .models import Membership

    track_changes(Tenant)
    user_logged_in.connect(signed_in, dispatch_uid="audit-signed-in", weak=False)
    user_login_failed.connect(sign_in_failed, dispatch_uid="audit-sign-in-failed", weak=False)
    track_changes(Membership, actions={Membership: membership_action})


# --- reading it back ---------------------------------------------------------------------------

EXPORT_FIELDS = (
    "id",
    "at",
    "user",
    "api_key",
    "action",
    "object_type",
    "object_id",
    "object_repr",
    "changes",
    "ip",
    "user_agent",
)


def actor_of(entry: AuditEntry) -> dict:
    """`{user?, api_key?: {id, name}}`; empty: the product itself acted (an expiry, a command)."""
    actor = {}
    if entry.actor_username:
        actor["user"] = entry.actor_username
    if entry.actor_api_key_name or entry.actor_api_key_id:
        actor["api_key"] = {"id": entry.actor_api_key_id, "name": entry.actor_api_key_name}
    return actor


def export_response(entries, fmt: str, filename: str) -> StreamingHttpResponse:
    """Every entry of `entries` as a CSV or JSON Lines download, streamed (API and admin)."""
    rows = (_export_row(entry) for entry in entries.iterator(chunk_size=1000))
    lines = _csv_lines(rows) if fmt == "csv" else (json.dumps(row, default=str) + "\n" for row in rows)
    response = StreamingHttpResponse(
        lines, content_type="text/csv" if fmt == "csv" else "application/x-ndjson"
    )
    response["Content-Disposition"] = f'attachment; filename="{filename}.{fmt}"'
    return response


def _export_row(entry: AuditEntry) -> dict:
    actor = actor_of(entry)
    return {
        "id": entry.pk,
        "at": entry.at.isoformat(),
        "user": actor.get("user", ""),
        "api_key": (actor.get("api_key") or {}).get("name", ""),
        "action": entry.action,
        "object_type": entry.object_type,
        "object_id": entry.object_id,
        "object_repr": entry.object_repr,
        "changes": entry.changes,
        "ip": entry.ip or "",
        "user_agent": entry.user_agent,
    }


def _csv_lines(rows):
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def flush() -> str:
        line = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return line

    writer.writerow(EXPORT_FIELDS)
    yield flush()
    for row in rows:
        row["changes"] = json.dumps(row["changes"], default=str)
        writer.writerow([_safe_cell(row[name]) for name in EXPORT_FIELDS])
        yield flush()


def _safe_cell(value):
    """Text a spreadsheet would run as a formula (=, +, -, @) is kept as text."""
    return f"'{value}" if isinstance(value, str) and value[:1] in ("=", "+", "-", "@") else value
