"""Process-level endpoints: health, and the JSON error pages of `/api/`."""

from __future__ import annotations

import time
import uuid

from django.core.cache import cache
from django.db import connection
from django.http import JsonResponse
from django.views import defaults
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from .api import json_error_response
from .celery import PING_CACHE_PREFIX, app, ping

WORKER_PING_TIMEOUT_S = 5.0


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


@never_cache
@require_GET
def healthz(request):
    """`{"status": "ok", "database": "ok", "broker": "ok"}`; 503 when a check fails.

    `?worker=1` also sends a `config.ping` task and waits for a worker to answer it.
    """
    checks = {"database": _check_database(), "broker": _check_broker()}
    if request.GET.get("worker") in ("1", "true", "yes"):
        checks["worker"] = _check_worker()
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse({"status": "ok" if healthy else "error", **checks}, status=200 if healthy else 503)


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
        return json_error_response(400, "bad_request", "The request could not be understood.")
    return defaults.bad_request(request, exception)


def permission_denied(request, exception=None):
    if _is_api(request):
        return json_error_response(403, "permission_denied", "You do not have permission to do that.")
    return defaults.permission_denied(request, exception)
