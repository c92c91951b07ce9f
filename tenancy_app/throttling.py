"""API abuse limits: the request rate and the concurrent long polls of one caller.

One caller is one API key, or one user for browser-session calls (anonymous calls: one
address). Both limits live in the shared cache (Redis in production), so they hold across
web processes; both answer 429 `throttled`. Both are counted with atomic cache operations,
so callers hammering in parallel cannot get past them.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, cache, caches
from django.core.cache.backends.redis import RedisCache
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


def count_call(key: str, window_s: int) -> tuple[int, float]:
    """Count one call in `key`'s current window: `(calls counted in it, seconds until it ends)`.

    A window opens with the first call after the last one ended and lasts `window_s`. The count
    is one atomic increment, so concurrent callers never both see the same count: on Redis, one
    MULTI of SET NX EX, INCR and PTTL; on other caches Django's `add` then `incr` (atomic on
    locmem too; not on the database or file caches, which this project does not configure).
    """
    backend = caches[DEFAULT_CACHE_ALIAS]  # `cache` is a proxy: isinstance needs the backend itself
    if isinstance(backend, RedisCache):
        full_key = backend.make_and_validate_key(key)
        # The cache's own Redis client (its pool, its server): Django's cache API has no step
        # that both opens a window with its expiry and counts in it atomically.
        with backend._cache.get_client(full_key, write=True).pipeline(transaction=True) as pipe:
            pipe.set(full_key, 0, ex=window_s, nx=True)
            pipe.incr(full_key)
            pipe.pttl(full_key)
            _, count, left_ms = pipe.execute()
        return count, max(left_ms, 0) / 1000
    ends_key = f"{key}:ends"
    for _ in range(3):
        now = time.time()
        if cache.add(key, 1, timeout=window_s):
            cache.set(ends_key, now + window_s, timeout=window_s)
            return 1, float(window_s)
        try:
            count = cache.incr(key)
        except ValueError:  # the window ended between `add` and `incr`: open the next one
            continue
        ends = cache.get(ends_key)
        return count, (ends - now) if ends is not None else float(window_s)
    raise RuntimeError(f"could not count a call in {key!r}")  # the cache drops keys as it writes them


class FixedWindowRateThrottle(SimpleRateThrottle):
    """A DRF rate (`"1200/min"`) as an atomic fixed-window counter per caller.

    DRF's SimpleRateThrottle reads the caller's history from the cache and writes it back, so
    concurrent calls read the same history and are all admitted (about 1,300 a minute got
    through a 1,200/min rate from 8 clients). Here each call is one atomic increment
    (`count_call`): of any number of concurrent calls, exactly the rate is admitted per window.
    Refused calls answer 429 `throttled` with `Retry-After` = the time left in the window.
    """

    window_left_s = 0.0

    def allow_request(self, request, view):
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        count, self.window_left_s = count_call(key, self.duration)
        return count <= self.num_requests

    def wait(self):
        return max(self.window_left_s, 1.0)


class ApiKeyRateThrottle(FixedWindowRateThrottle):
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
