"""Long poll of a Session's event log: `GET /api/v1/sessions/{id}/events/?after=<seq>&wait=<s>`.

An async view, so a waiting request holds no database connection and keeps no thread busy:

1. The DRF action `SessionViewSet.events` runs first, in one short sync block: the same
   authentication, tenant, permission, throttle (the call counts in the caller's rate),
   validation and `for_tenant` 404 as every API route, then one read of the log.
2. Events found, or no `wait`: that answer goes out as is.
3. Otherwise the view subscribes a fresh channel to the Session's group, reads the log again
   (an event committed before the subscription has no notification coming), takes one of
   the caller's XAGENT_LONG_POLL_MAX_PER_KEY slots (429 beyond) and awaits a `session.event`
   notification until `wait` runs out. The log is the truth: a notification only says
   "read again".
4. The same channel listens on the caller's revocation groups (tenancy_app.revocation), and
   every read after the first pass checks the caller's access again: a wait whose key is
   revoked, or whose user leaves the tenant or is deactivated, ends at once with the error the
   caller's next call gets (`_access_ended`) — never with events, never at the end of `wait`.

Each database block closes its connection before the view awaits anything. A client that
disconnects cancels the view (Django's ASGIHandler), which unsubscribes and frees the slot.
This needs every middleware to be async-capable: one sync-only middleware would make Django
call the view through `async_to_sync`, on a thread blocked for the whole wait.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connections
from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from rest_framework.renderers import JSONRenderer

from config.api import ParameterError, json_error_response
from tenancy_app.revocation import Principal
from tenancy_app.throttling import acquire_long_poll_slot, release_long_poll_slot

from ..models import Session, SessionEvent
from ..runtime.events import session_group
from .serializers import EventSerializer

logger = logging.getLogger("xagent.api")

MAX_WAIT_S = 30.0
EVENT_PAGE = 500
# What ended a wait for a notification (`_notified`).
EVENT_NOTICE, ACCESS_NOTICE, TIMED_OUT = "event", "access", "timed_out"


@dataclass(frozen=True)
class LongPoll:
    """What the DRF action hands to the async view when the caller should wait."""

    session_id: object
    after: int
    wait: float
    caller: str  # tenancy_app.throttling.caller_ident
    principal: Principal  # whose access must still hold when the answer goes out


def parse_wait(raw: str | None) -> float:
    """`wait` in seconds: a finite number from 0 to 30; anything else is a 400 naming it."""
    if raw in (None, ""):
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= MAX_WAIT_S:
        raise ParameterError("wait", f"must be a number of seconds from 0 to {MAX_WAIT_S:.0f}, got {raw!r}")
    return value


def read_events(session_id, after: int) -> dict:
    """One page of the log after `after`: `{"events": [...], "last_seq": int}`. `last_seq` is the
    last event returned, or with none the Session's own last seq (never the request's `after`:
    a client asking beyond the log learns where it really ends). The Session's is read first: an
    event committed meanwhile is then after it, never skipped by a client resuming from it."""
    session_seq = Session.objects.filter(pk=session_id).values_list("last_event_seq", flat=True).first() or 0
    rows = list(
        SessionEvent.objects.filter(session_id=session_id, seq__gt=after).order_by("seq")[:EVENT_PAGE]
    )
    last_seq = rows[-1].seq if rows else min(session_seq, max(after, 0))
    return {"events": EventSerializer(rows, many=True).data, "last_seq": last_seq}


def _read_if_authorized(poll: LongPoll) -> dict | None:
    """`read_events` for the waiting caller, or None once its access has ended."""
    if not poll.principal.still_authorized():
        return None
    return read_events(poll.session_id, poll.after)


def _access_ended(principal: Principal) -> HttpResponse:
    """The answer once access ended mid-wait, the one the caller's next call gets: for an API key
    401 `authentication_failed` (tenancy_app.authentication), for the browser session of a user
    who left the tenant 403 `permission_denied`."""
    if principal.api_key_id is None:
        return json_error_response(403, "permission_denied", "Your access to this tenant has ended.")
    response = json_error_response(401, "authentication_failed", "Invalid or revoked API key.")
    response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


def _release_connections() -> None:
    # Never inside a transaction someone else opened (a test's, an ATOMIC_REQUESTS one).
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()


def _in_db_block(fn):
    """Run `fn` on Django's request thread and give its database connection back afterwards."""

    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            _release_connections()

    return sync_to_async(run, thread_sensitive=True)


@functools.cache
def _drf_events_view():
    from .views import SessionViewSet  # views imports this module's helpers

    return SessionViewSet.as_view({"get": "events"})


def _first_pass(request, pk):
    response = _drf_events_view()(request, pk=pk)
    if getattr(response, "long_poll", None) is None and hasattr(response, "render"):
        response.render()  # here, while a thread is at hand, not later on the event loop
    return response


def _json(body: dict) -> HttpResponse:
    return HttpResponse(JSONRenderer().render(body), content_type="application/json")


@never_cache
async def session_events(request, pk):
    response = await _in_db_block(_first_pass)(request, pk)
    poll: LongPoll | None = getattr(response, "long_poll", None)
    if poll is None:
        return response
    layer = get_channel_layer()
    if layer is None:  # nothing could wake the wait
        return response
    groups = [session_group(poll.session_id), *poll.principal.groups()]
    channel = await layer.new_channel()
    for group in groups:
        await layer.group_add(group, channel)
    try:
        return await _wait_subscribed(layer, channel, poll)
    finally:
        # Shielded: a disconnect cancels the view, and the groups must still lose the channel.
        await asyncio.shield(_leave(layer, groups, channel))


async def _leave(layer, groups: list[str], channel: str) -> None:
    for group in groups:
        await layer.group_discard(group, channel)


async def _wait_subscribed(layer, channel: str, poll: LongPoll) -> HttpResponse:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + poll.wait
    read = _in_db_block(_read_if_authorized)
    # Read again now that the channel listens: an event committed, or access ended, between the
    # first read and the subscription has no notification coming.
    page = await read(poll)
    if page is None:
        return _access_ended(poll.principal)
    if page["events"]:
        return _json(page)
    slot = await sync_to_async(acquire_long_poll_slot, thread_sensitive=False)(poll.caller, poll.wait)
    if slot is None:
        refused = json_error_response(
            429, "throttled", "Too many long polls are open for this API key or user; close one first."
        )
        refused["Retry-After"] = "1"
        return refused
    try:
        while True:
            woken_by = await _notified(layer, channel, poll.after, deadline - loop.time())
            # Announced or timed out, the log decides: a dropped notification costs only latency.
            page = await read(poll)
            if page is None:
                return _access_ended(poll.principal)
            if woken_by != ACCESS_NOTICE or page["events"] or loop.time() >= deadline:
                return _json(page)
            # A notice whose cause did not last (the user was reactivated at once): wait on.
    finally:
        # Shielded for the same reason: the slot must be given back on a disconnect. A cancelled
        # handler still waits for the release, so no new poll of the same caller finds it held.
        release = asyncio.ensure_future(sync_to_async(release_long_poll_slot, thread_sensitive=False)(slot))
        try:
            await asyncio.shield(release)
        except asyncio.CancelledError:
            await release
            raise


async def _notified(layer, channel: str, after: int, timeout: float) -> str:
    """EVENT_NOTICE once an event after `after` is announced within `timeout`, ACCESS_NOTICE once
    the caller's access may have ended, else TIMED_OUT; live deltas and late notices of events
    the caller already has are skipped."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(timeout, 0)
    while (remaining := deadline - loop.time()) > 0:
        try:
            message = await asyncio.wait_for(layer.receive(channel), remaining)
        except TimeoutError:  # asyncio's: the caller's wait ran out
            return TIMED_OUT
        except Exception:
            # The channel layer is only a notification bus: a read timeout of its blocking pop or
            # a Redis hiccup must not fail the request. Listen again after a short pause; the log
            # decides what the caller gets.
            logger.warning("Long poll notification failed; listening again", exc_info=True)
            await asyncio.sleep(min(0.5, max(deadline - loop.time(), 0)))
            continue
        if message.get("type") == "access.revoked":
            return ACCESS_NOTICE
        if message.get("type") == "session.event" and (message["event"].get("seq") or 0) > after:
            return EVENT_NOTICE
        if message.get("type") == "session.events" and any(
            (e.get("seq") or 0) > after for e in message["events"]
        ):
            return EVENT_NOTICE
    return TIMED_OUT
