"""API-wide conventions: the CONTRACT error shape, request parsing limits and cursor pagination.

Every API error, validation included, answers
`{"error": {"code": "<snake_case>", "message": "<sentence>", "details": {...}}}`.
Bad input is a 4xx, never a 5xx: oversized bodies are 413 (see also `config.middleware`),
tampered cursors are 400, and an error about a query parameter or header names it. JSON depth
is `config.parsers`.
"""

from __future__ import annotations

import logging
from datetime import datetime, time, timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import connection
from django.http import Http404, JsonResponse
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from rest_framework import exceptions, negotiation, pagination, status
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


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"

    def __init__(self, detail: str | None = None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        super().__init__(
            detail or f"The request body is larger than this server accepts ({limit} bytes).",
            code="payload_too_large",
        )


class ParameterError(exceptions.ValidationError):
    """400 about one query parameter (or header): the message and `details` name it.

    `raise ParameterError("after", "must be an integer")` answers
    `validation_error`, "Query parameter `after` is not valid: must be an integer", {"after": [...]}.
    """

    def __init__(self, name: str, message: str, *, where: str = "query"):
        super().__init__({name: [message]})
        self.where = where


_WHERE_LABEL = {"query": "Query parameter", "header": "Header"}


def error_body(code: str, message: str, details: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def _query_parameter_errors(exc: exceptions.ValidationError, request) -> bool:
    """A plain ValidationError whose every key is a query parameter of a body-less request."""
    if request is None or request.method not in ("GET", "HEAD", "OPTIONS", "DELETE"):
        return False
    if not isinstance(exc.detail, dict) or not exc.detail:
        return False
    return all(key in request.query_params for key in exc.detail)


def parameter_message(where: str, names: list[str], detail: dict) -> str:
    label = _WHERE_LABEL.get(where, "Parameter")
    if len(names) == 1:
        reasons = detail[names[0]]
        first = reasons[0] if isinstance(reasons, list) and reasons else reasons
        return f"{label} `{names[0]}` is not valid: {first}"
    return f"{label}s {', '.join(f'`{n}`' for n in names)} are not valid; see details."


def _describe(exc: exceptions.APIException, request=None) -> tuple[str, str, dict]:
    if isinstance(exc, Conflict):
        return exc.error_code, str(exc.detail), exc.details
    if isinstance(exc, exceptions.ValidationError):
        details = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        where = getattr(exc, "where", None) or ("query" if _query_parameter_errors(exc, request) else None)
        if where:
            return "validation_error", parameter_message(where, list(details), details), details
        return "validation_error", "The request body is not valid; see details for each field.", details
    code = exc.default_code
    if isinstance(exc.detail, str) or not isinstance(exc.detail, (dict, list)):
        code = getattr(exc.detail, "code", None) or code
        message = str(exc.detail)
    else:
        message = str(exc.default_detail)
    # An exception may carry its own details (a limit and the size that passed it).
    details = getattr(exc, "details", None)
    return _CODE_NAMES.get(code, code), message, details if isinstance(details, dict) else {}


def exception_handler(exc, context):
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        # Django raises these lazily, when the body is first read (DRF's JSON parser reads it).
        exc = PayloadTooLarge()
    elif isinstance(exc, (TooManyFieldsSent, TooManyFilesSent)):
        exc = exceptions.ParseError(f"The request body has too many parts: {exc}", code="too_many_fields")
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
    code, message, details = _describe(exc, context.get("request"))
    response.data = error_body(code, message, details)
    return response


def json_error_response(status_code: int, code: str, message: str) -> JsonResponse:
    return JsonResponse(error_body(code, message), status=status_code)


class CursorPagination(pagination.CursorPagination):
    """`{"results": [...], "next": url | null, "previous": url | null}`, newest first.

    A cursor is client-held text: one that does not decode, or whose position is not a value
    of the ordering field, is a 400 naming `cursor` rather than a database error.
    """

    ordering = "-id"
    page_size_query_param = "page_size"
    max_page_size = 200

    def paginate_queryset(self, queryset, request, view=None):
        self._model = queryset.model
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request):
        try:
            cursor = super().decode_cursor(request)
        except exceptions.NotFound:
            raise ParameterError(self.cursor_query_param, "this cursor was not issued by this API") from None
        if (
            cursor is not None
            and cursor.position is not None
            and not self._position_is_valid(cursor.position)
        ):
            raise ParameterError(self.cursor_query_param, "this cursor was not issued by this API")
        return cursor

    def _position_is_valid(self, position: str) -> bool:
        if "\x00" in position:
            return False
        model = getattr(self, "_model", None)
        name = self.ordering[0].lstrip("-") if isinstance(self.ordering, (list, tuple)) else ""
        try:
            field = model._meta.get_field(name) if model is not None and name else None
        except Exception:  # an ordering by something other than a concrete field: nothing to check
            return True
        if field is None:
            return True
        try:
            value = field.to_python(position)
        except (DjangoValidationError, ValueError, TypeError):
            return False
        if isinstance(value, int):
            low, high = connection.ops.integer_field_range(field.get_internal_type())
            return (low is None or value >= low) and (high is None or value <= high)
        return True

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


def query_moment(name: str, raw: str | None, *, end_of_day: bool = False):
    """A `from`/`to` query parameter: a date (with `end_of_day`, the moment that day ends, so
    `to=2026-12-01` includes the whole day) or an ISO 8601 date-time; None when absent. Anything
    else, a 400 naming the parameter."""
    if not raw:
        return None
    try:
        value = parse_datetime(raw) if "T" in raw or " " in raw else parse_date(raw)
    except ValueError:  # well formed, but no such day or time (2026-13-45)
        value = None
    if value is None:
        raise ParameterError(name, "must be a date (2026-12-01) or an ISO 8601 date and time")
    if isinstance(value, datetime):
        return value if timezone.is_aware(value) else timezone.make_aware(value)
    return timezone.make_aware(datetime.combine(value + timedelta(days=1) if end_of_day else value, time.min))


class JSONOnlyNegotiation(negotiation.BaseContentNegotiation):
    """A route that answers bytes it streams itself (a raw file, an export) or a JSON error,
    whatever the client's `Accept` or `?format=` says (an `<img>` or an iframe asks for images or
    HTML, and must not get a 406). Its other renderers only tell the schema its media types."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type
