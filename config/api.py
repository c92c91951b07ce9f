"""API-wide conventions: the CONTRACT error shape and cursor pagination.

Every API error, validation included, answers
`{"error": {"code": "<snake_case>", "message": "<sentence>", "details": {...}}}`.
"""

from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, JsonResponse
from rest_framework import exceptions, pagination, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

logger = logging.getLogger("xagent.api")

# DRF's default codes, renamed where the default reads poorly to an integrator.
_CODE_NAMES = {
    "invalid": "validation_error",
    "parse_error": "malformed_body",
    "not_authenticated": "not_authenticated",
    "authentication_failed": "authentication_failed",
    "permission_denied": "permission_denied",
    "not_found": "not_found",
    "method_not_allowed": "method_not_allowed",
    "not_acceptable": "not_acceptable",
    "unsupported_media_type": "unsupported_media_type",
    "throttled": "throttled",
}


class Conflict(exceptions.APIException):
    """409 with a specific code, e.g. `Conflict("already_decided", "This approval was already decided.")`."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"

    def __init__(self, code: str, message: str, details: dict | None = None):
        super().__init__(detail=message, code=code)
        self.error_code = code
        self.details = details or {}


def error_body(code: str, message: str, details: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def _describe(exc: exceptions.APIException) -> tuple[str, str, dict]:
    if isinstance(exc, Conflict):
        return exc.error_code, str(exc.detail), exc.details
    if isinstance(exc, exceptions.ValidationError):
        details = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        return "validation_error", "The request body is not valid; see details for each field.", details
    code = exc.default_code
    if isinstance(exc.detail, str) or not isinstance(exc.detail, (dict, list)):
        code = getattr(exc.detail, "code", None) or code
        message = str(exc.detail)
    else:
        message = str(exc.default_detail)
    return _CODE_NAMES.get(code, code), message, {}


def exception_handler(exc, context):
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        # An unexpected crash: log it with its traceback and answer in the same shape,
        # without leaking internals to the caller.
        set_rollback()
        logger.exception("Unhandled error in %s", context.get("view").__class__.__name__, exc_info=exc)
        return Response(
            error_body("server_error", "The server hit an unexpected error; it has been logged."),
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )
    code, message, details = _describe(exc)
    response.data = error_body(code, message, details)
    return response


def json_error_response(status_code: int, code: str, message: str) -> JsonResponse:
    return JsonResponse(error_body(code, message), status=status_code)


class CursorPagination(pagination.CursorPagination):
    """`{"results": [...], "next": url | null, "previous": url | null}`, newest first."""

    ordering = "-id"
    page_size_query_param = "page_size"
    max_page_size = 200

    def get_paginated_response(self, data):
        return Response({"results": data, "next": self.get_next_link(), "previous": self.get_previous_link()})

    def get_paginated_response_schema(self, schema):
        return {
            "type": "object",
            "required": ["results", "next"],
            "properties": {
                "results": schema,
                "next": {"type": "string", "nullable": True, "format": "uri"},
                "previous": {"type": "string", "nullable": True, "format": "uri"},
            },
        }
