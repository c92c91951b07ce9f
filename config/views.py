"""Process-level endpoints: health, and the JSON error pages of `/api/`."""

from __future__ import annotations

import time
import uuid

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.utils.html import escape
from django.views import defaults
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from .api import PayloadTooLarge, json_error_response
from .celery import PING_CACHE_PREFIX, app, ping

WORKER_PING_TIMEOUT_S = 5.0
# `?worker=1` costs a broker message and up to WORKER_PING_TIMEOUT_S of a thread: callers who
# are not staff trigger at most one real ping per interval (across processes, through the
# cache) and otherwise get the last result with its age.
WORKER_PING_MIN_INTERVAL_S = 10
WORKER_PING_LOCK_KEY = "xagent:healthz:worker-ping"
WORKER_LAST_RESULT_KEY = "xagent:healthz:worker-last"


def _check_database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        return "ok"
    except Exception as exc:  # a health check reports, it does not raise
        return f"error: {exc.__class__.__name__}: {exc}"


def _check_broker() -> str:
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return "ok"
    except Exception as exc:
        return f"error: {exc.__class__.__name__}: {exc}"


def _check_worker() -> str:
    """Round-trip a `config.ping` task through the broker and a worker."""
    nonce = uuid.uuid4().hex
    try:
        ping.delay(nonce)
    except Exception as exc:
        return f"error: {exc.__class__.__name__}: {exc}"
    deadline = time.monotonic() + WORKER_PING_TIMEOUT_S
    while time.monotonic() < deadline:
        if cache.get(PING_CACHE_PREFIX + nonce) == "pong":
            cache.delete(PING_CACHE_PREFIX + nonce)
            return "ok"
        time.sleep(0.02)
    return f"error: no worker answered within {WORKER_PING_TIMEOUT_S:.0f} s"


def _worker_check(request) -> dict:
    """`{"worker": result}`, pinging now (staff, or the first caller of the interval), else
    `{"worker": last result, "worker_checked_s_ago": age}`."""
    user = getattr(request, "user", None)
    if (user is not None and user.is_staff) or cache.add(
        WORKER_PING_LOCK_KEY, 1, timeout=WORKER_PING_MIN_INTERVAL_S
    ):
        result = _check_worker()
        cache.set(WORKER_LAST_RESULT_KEY, {"result": result, "at": time.time()}, timeout=None)
        return {"worker": result}
    last = cache.get(WORKER_LAST_RESULT_KEY)
    if last is None:  # the interval's ping is still on its way, in another request
        return {"worker": "pending: a worker check is in progress, try again in a few seconds"}
    return {"worker": last["result"], "worker_checked_s_ago": round(max(time.time() - last["at"], 0.0), 1)}


@never_cache
@require_GET
def healthz(request):
    """`{"status": "ok", "database": "ok", "broker": "ok"}`; 503 when a check fails.

    `?worker=1` also round-trips a `config.ping` task through a worker: always for staff,
    at most once per WORKER_PING_MIN_INTERVAL_S for anyone else (who may get the last
    result and its age, `worker_checked_s_ago`).
    """
    checks = {"database": _check_database(), "broker": _check_broker()}
    extra = {}
    if request.GET.get("worker") in ("1", "true", "yes"):
        worker = _worker_check(request)
        checks["worker"] = worker.pop("worker")
        extra = worker
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "error", **checks, **extra}, status=200 if healthy else 503
    )


def _is_api(request) -> bool:
    return request.path.startswith("/api/")


def page_not_found(request, exception=None):
    if _is_api(request):
        return json_error_response(404, "not_found", f"No API route matches {request.path}.")
    return defaults.page_not_found(request, exception)


def server_error(request):
    if _is_api(request):
        return json_error_response(
            500, "server_error", "The server hit an unexpected error; it has been logged."
        )
    return defaults.server_error(request)


def bad_request(request, exception=None):
    if _is_api(request):
        if isinstance(exception, (RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent)):
            # Raised outside a DRF view (e.g. by middleware reading the form): still a 413.
            return json_error_response(413, "payload_too_large", str(PayloadTooLarge().detail))
        return json_error_response(400, "bad_request", "The request could not be understood.")
    if isinstance(exception, RequestDataTooBig):
        # A browser form (say, a pasted SKILL.md in admin) over the body limit: say which limit.
        size = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        limit = f"{size / 1024 / 1024:.1f} MB" if size >= 1024 * 1024 else f"{size // 1024} KB"
        return HttpResponse(
            "<!doctype html><title>Too large</title><h1>The form is too large</h1>"
            f"<p>Form fields may hold at most {limit} in all (XAGENT_MAX_BODY_BYTES). Upload large "
            f"content as a file instead (a Skill as a zip).</p><p><a href='{escape(request.path)}'>Back to the form</a></p>",
            status=413,
        )
    return defaults.bad_request(request, exception)


def permission_denied(request, exception=None):
    if _is_api(request):
        return json_error_response(403, "permission_denied", "You do not have permission to do that.")
    return defaults.permission_denied(request, exception)
