"""API abuse limits: the request rate and the concurrent long polls of one caller.

One caller is one API key, or one user for browser-session calls (anonymous calls: one
address). Both limits live in the shared cache (Redis in production), so they hold across
web processes; both answer 429 `throttled`.
"""

from __future__ import annotations

from django.conf import settings
from django.core.cache import cache
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

from .models import ApiKey

# A held slot outlives its wait by this much, so a process that dies mid-wait frees its
# slots on its own, while a live wait can never lose its slot to expiry.
LONG_POLL_SLOT_GRACE_S = 30


def caller_ident(request) -> str:
    """`key:<id>`, `user:<id>` or `addr:<ip>`: whose budget a DRF request spends."""
    if isinstance(request.auth, ApiKey):
        return f"key:{request.auth.pk}"
    if request.user is not None and request.user.is_authenticated:
        return f"user:{request.user.pk}"
    return f"addr:{BaseThrottle().get_ident(request)}"


class ApiKeyRateThrottle(SimpleRateThrottle):
    """`DEFAULT_THROTTLE_RATES["api_key"]` per key; calls made with the browser session share
    one bucket per user, anonymous calls one per address."""

    scope = "api_key"

    def get_rate(self):
        # DRF reads the rates once at import (SimpleRateThrottle.THROTTLE_RATES); reading
        # them per request lets override_settings and a reloaded configuration apply.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": caller_ident(request)}


class UserRateThrottle(ApiKeyRateThrottle):
    """`DEFAULT_THROTTLE_RATES["user"]` per user, across all of their keys and the browser: a
    user who mints many keys does not multiply their budget. Anonymous calls are left to the
    per-address bucket of ApiKeyRateThrottle."""

    scope = "user"

    def get_cache_key(self, request, view):
        if request.user is None or not request.user.is_authenticated:
            return None
        return self.cache_format % {"scope": self.scope, "ident": f"user:{request.user.pk}"}


def _slot_keys(ident: str) -> list[str]:
    limit = settings.XAGENT_LONG_POLL_MAX_PER_KEY
    return [f"xagent:longpoll:{ident}:{n}" for n in range(limit)]


def acquire_long_poll_slot(ident: str, wait_s: float) -> str | None:
    """Take one of the caller's XAGENT_LONG_POLL_MAX_PER_KEY slots; None when all are held.

    Each slot is its own cache key claimed with an atomic `add` (SETNX on Redis), so two
    processes never take the same one, and it expires by itself after the wait.
    """
    keys = _slot_keys(ident)
    held = cache.get_many(keys)
    timeout = int(wait_s) + LONG_POLL_SLOT_GRACE_S
    for key in keys:
        if key not in held and cache.add(key, 1, timeout=timeout):
            return key
    return None


def release_long_poll_slot(slot: str) -> None:
    cache.delete(slot)


def long_poll_slots_held(ident: str) -> int:
    return len(cache.get_many(_slot_keys(ident)))
