"""OpenAPI generation (drf-spectacular): every operation documents the errors it can answer.

The CONTRACT error shape is one component, `Error`. Each operation gets the statuses that can
apply to it, derived from what it is, so a new endpoint is documented without per-view work:

* 401 `not_authenticated`/`authentication_failed`, 403 `permission_denied`, 429 `throttled`:
  any operation that needs a caller (every API operation today);
* 400 `validation_error`/`malformed_body`: a request body, a query parameter or a header
  parameter to validate (cursors included);
* 404 `not_found`: an object in the path (another tenant's object is a 404 too);
* 413 `payload_too_large`, 415 `unsupported_media_type`: a request body.

Statuses an operation declares itself (409 `already_decided` on a decision) are kept as declared.
"""

from __future__ import annotations

from drf_spectacular import openapi
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import OpenApiResponse
from rest_framework import permissions

ERROR_COMPONENT = "Error"

ERROR_SCHEMA = {
    "type": "object",
    "description": "Every API error, validation included.",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "pattern": "^[a-z][a-z0-9_]*$",
                    "description": "snake_case, stable: e.g. `validation_error`, `not_found`, `throttled`",
                },
                "message": {"type": "string", "description": "a sentence for a person"},
                "details": {
                    "type": "object",
                    "additionalProperties": True,
                    "description": "e.g. the problems of each field of a `validation_error`",
                },
            },
            "required": ["code", "message", "details"],
            "additionalProperties": False,
        }
    },
    "required": ["error"],
    "additionalProperties": False,
}

ERROR_DESCRIPTIONS = {
    400: "Invalid input: `validation_error` (details name each field or parameter) or `malformed_body`.",
    401: "No or bad credentials: `not_authenticated` or `authentication_failed`.",
    403: "`permission_denied`: the caller may not do this (or is in no tenant).",
    404: "`not_found`: no such object in the caller's tenant.",
    409: "A conflict with the object's state, e.g. `already_decided`.",
    413: "`payload_too_large`: the request body is over the server's limit.",
    415: "`unsupported_media_type`: a request body in a format this operation does not read.",
    429: "`throttled`: too many requests for this key; retry after the `Retry-After` seconds.",
}


class _ErrorIdentity:
    """The registry's identity for the `Error` component (any hashable that is not a serializer)."""


def error_response(status_code: int) -> dict:
    return {
        "description": ERROR_DESCRIPTIONS.get(status_code, "An error."),
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}}},
    }


class AutoSchema(openapi.AutoSchema):
    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        statuses = self.error_statuses(operation)
        if statuses:
            registry.register_on_missing(
                ResolvedComponent(
                    name=ERROR_COMPONENT,
                    type=ResolvedComponent.SCHEMA,
                    object=_ErrorIdentity,
                    schema=ERROR_SCHEMA,
                )
            )
        responses = operation["responses"]
        for status_code in statuses:
            responses.setdefault(str(status_code), error_response(status_code))
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def error_statuses(self, operation: dict) -> list[int]:
        statuses = set()
        if self._needs_a_caller():
            statuses |= {401, 403}
        if self.view.get_throttles():
            statuses.add(429)
        parameters = operation.get("parameters", [])
        if "requestBody" in operation:
            statuses |= {400, 413, 415}
        if any(p.get("in") in ("query", "header") for p in parameters):
            statuses.add(400)
        if any(p.get("in") == "path" for p in parameters):
            statuses.add(404)
        return sorted(statuses)

    def _needs_a_caller(self) -> bool:
        return not any(isinstance(p, permissions.AllowAny) for p in self.view.get_permissions())


def error(description: str) -> OpenApiResponse:
    """A documented error status of one operation, e.g. `responses={409: error("already_decided: …")}`."""
    return OpenApiResponse({"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}, description=description)
