"""The edge of `/api/`: refuses, in the CONTRACT error shape, requests no view should see.

- a declared body over `DATA_UPLOAD_MAX_MEMORY_SIZE` -> 413 `payload_too_large`, before it is
  read (a chunked body, which declares no length, is measured in the ASGI handler's buffer and
  given its Content-Length, so DRF reads it and the same limit applies); a multipart upload is
  measured the same way but judged by the upload view against `XAGENT_UPLOAD_MAX_BYTES`;
- a NUL character in the path or a query parameter -> 400 naming it (PostgreSQL cannot store
  or compare text holding NUL, so it would otherwise surface as a database error);
- a path no route matches -> JSON 404, also with DEBUG on, where Django's `handler404` is not
  used. A GET/HEAD that only lacks its trailing slash is left to CommonMiddleware's redirect.

Place it before `CommonMiddleware`, so an unknown POST never reaches APPEND_SLASH (which raises
under DEBUG).
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.core.exceptions import TooManyFieldsSent
from django.http import JsonResponse
from django.urls import Resolver404, get_resolver

from .api import error_body, parameter_message

API_PREFIX = "/api/"
NUL = "\x00"


def _json(status: int, code: str, message: str, details: dict | None = None) -> JsonResponse:
    return JsonResponse(error_body(code, message, details), status=status)


class ApiRequestGuardMiddleware:
    # Sync and async: one sync-only middleware would put the whole chain (and every long poll)
    # on a thread. The checks themselves touch neither the database nor the body.
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self._async:
            return self.__acall__(request)
        return self._refusal(request) or self.get_response(request)

    async def __acall__(self, request):
        return self._refusal(request) or await self.get_response(request)

    def _refusal(self, request):
        if not request.path.startswith(API_PREFIX):
            return None
        return self._too_large(request) or self._nul_refusal(request) or self._unrouted(request)

    @staticmethod
    def _too_large(request):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return None
        if not length and request.method in ("POST", "PUT", "PATCH"):
            length = _declare_buffered_length(request)
        # An upload's size is the upload view's to judge (XAGENT_UPLOAD_MAX_BYTES).
        if limit is None or request.content_type == "multipart/form-data" or length <= limit:
            return None
        return _json(
            413,
            "payload_too_large",
            f"The request body is larger than this server accepts ({limit} bytes).",
            {"limit_bytes": limit, "content_length": length},
        )

    @staticmethod
    def _nul_refusal(request):
        if NUL in request.path:
            return _json(
                400, "validation_error", "The path must not contain NUL characters.", {"path": ["NUL"]}
            )
        try:
            params = list(request.GET.lists())
        except TooManyFieldsSent:
            return _json(400, "validation_error", "The query string has too many parameters.")
        bad = sorted({name for name, values in params if NUL in name or any(NUL in v for v in values)})
        if not bad:
            return None
        details = {name.replace(NUL, "\\u0000"): ["must not contain NUL characters"] for name in bad}
        return _json(400, "validation_error", parameter_message("query", list(details), details), details)

    @staticmethod
    def _unrouted(request):
        resolver = get_resolver(getattr(request, "urlconf", None))
        path = request.path_info
        if _resolves(resolver, path):
            return None
        if settings.APPEND_SLASH and not path.endswith("/") and _resolves(resolver, path + "/"):
            if request.method in ("GET", "HEAD"):
                return None  # CommonMiddleware answers with the redirect
            return _json(
                404,
                "not_found",
                f"No API route matches {request.path}; did you mean {request.path}/ (with the trailing slash)?",
            )
        return _json(404, "not_found", f"No API route matches {request.path}.")


def _declare_buffered_length(request) -> int:
    """A chunked body has no Content-Length: DRF would read it as empty and Django would not
    apply its size limit. The ASGI handler has already buffered the whole body (spooled to disk
    when large), so measure it and declare its length; the caller then applies the same limit."""
    stream = getattr(request, "_stream", None)
    if stream is None or not hasattr(stream, "seek") or not hasattr(stream, "tell"):
        return 0
    try:
        start = stream.tell()
        size = stream.seek(0, 2) - start
        stream.seek(start)
    except (OSError, ValueError):
        return 0
    if size > 0:
        request.META["CONTENT_LENGTH"] = str(size)
    return size


def _resolves(resolver, path: str) -> bool:
    try:
        resolver.resolve(path)
    except Resolver404:
        return False
    return True


class ProductNotFoundMiddleware:
    """Outside `/api/` and the admin, a 404 is the product's page (templates/404.html) in every
    mode: with DEBUG on (embedded mode, `make run`) Django would otherwise show its technical
    page, URL patterns and all, for an unknown workspace address."""

    sync_capable = True
    async_capable = True
    SKIPPED = (API_PREFIX, "/admin/", settings.STATIC_URL)

    def __init__(self, get_response):
        self.get_response = get_response
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self._async:
            return self.__acall__(request)
        return self._product_page(request, self.get_response(request))

    async def __acall__(self, request):
        response = await self.get_response(request)
        if self._replaces(request, response):
            return await sync_to_async(self._product_page)(request, response)
        return response

    def _replaces(self, request, response) -> bool:
        return (
            settings.DEBUG
            and response.status_code == 404
            and not request.path.startswith(self.SKIPPED)
            and response.get("Content-Type", "").startswith("text/html")
        )

    def _product_page(self, request, response):
        if not self._replaces(request, response):
            return response
        from .views import page_not_found

        return page_not_found(request)
