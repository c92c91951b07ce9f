"""Pending MCP input requests (elicitation) of a running tool call (ARCHITECTURE §1, §7).

A server may ask the person a question in the middle of a tool call (`elicitation/create`).
The tool's handler, in the runner, commits an `InputRequest` (+ `input.requested`) and waits;
the answer is written here by whoever gives it — a person from the browser, the API or the
WebSocket (`answer_input`), the handler's own timeout (`expire_input`, the server is told
`decline`) or an interrupt (`cancel_input`, the server is told `cancel`) — each a compare-and-set
on `pending` with its `input.answered` event, so exactly one of them wins. The handler may run
in another process than the answer (a Celery worker vs. the web process): it reads the row.

`validate_answer` checks accepted content against the requested schema (MCP's flat objects of
primitives), so the server only ever receives content of the shape it asked for.
"""

from __future__ import annotations

import logging
import math
import re
from datetime import date, datetime, timedelta

from django.utils import timezone

from ...choices import InputRequestAction, InputRequestStatus
from ...models import InputRequest
from ..events import emit
from .fencing import locked_session

logger = logging.getLogger(__name__)

# action a person sends -> the status it leads to
ANSWERS = {
    InputRequestAction.ACCEPT: InputRequestStatus.ACCEPTED,
    InputRequestAction.DECLINE: InputRequestStatus.DECLINED,
    InputRequestAction.CANCEL: InputRequestStatus.CANCELLED,
}
MAX_MESSAGE_CHARS = 5000
MAX_STRING_CHARS = 10000  # one answered field; the schema's own maxLength may be lower
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:\S+$")


class AlreadyAnswered(Exception):
    """The request is no longer pending (answered, expired or cancelled before)."""

    def __init__(self, request: InputRequest):
        super().__init__(f"input request {request.pk} is already {request.status}")
        self.request = request


class InvalidAnswer(ValueError):
    """The content does not fit the requested schema; `errors` maps each field to its messages."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__("the answer does not fit the requested schema")
        self.errors = errors


# --- the runner's side ----------------------------------------------------------------------


def request_input(
    session_id,
    token,
    *,
    call_id: str,
    server: str,
    tool: str,
    message: str,
    schema: dict,
    timeout_seconds: float,
) -> InputRequest:
    """Commit a pending request + `input.requested` (fenced on the slice's lease when `token`)."""
    with locked_session(session_id, token) as session:
        request = InputRequest.objects.create(
            tenant_id=session.tenant_id,
            session=session,
            turn_id=session.current_turn_id,
            call_id=call_id[:200],
            server=server[:200],
            tool=tool[:200],
            message=_without_nul(message)[:MAX_MESSAGE_CHARS],
            schema=_without_nul(schema) if isinstance(schema, dict) else {},
            expires_at=timezone.now() + timedelta(seconds=timeout_seconds),
        )
        logger.info(
            "input request %s: session %s, call %s, server %s", request.pk, session.pk, call_id, server
        )
        emit(
            session,
            "input.requested",
            {
                "request_id": request.pk,
                "call_id": request.call_id,
                "server": request.server,
                "tool": request.tool,
                "message": request.message,
                "schema": request.schema,
                "expires_at": request.expires_at.isoformat(),
            },
        )
    return request


def _without_nul(value):
    """`value` with every NUL of its strings (keys too) shown as U+FFFD: a server's message or
    schema may hold one, and PostgreSQL cannot store it."""
    if isinstance(value, str):
        return value.replace(NUL, "\ufffd")
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    return value


def input_answer(request_id: int) -> dict | None:
    """`{"status", "action", "content"}` once the request is closed, None while it is pending
    (the waiting handler's poll: one small read)."""
    row = InputRequest.objects.filter(pk=request_id).values("status", "action", "content").first()
    if row is None:  # gone (its Session was deleted): nobody will answer
        return {"status": InputRequestStatus.CANCELLED, "action": InputRequestAction.CANCEL, "content": None}
    return None if row["status"] == InputRequestStatus.PENDING else row


def close_input(request_id: int, *, expired: bool) -> bool:
    """The waiting side gives up: timed out (`expired`, the server is told decline) or interrupted
    (`cancelled`, told cancel). False when an answer got there first."""
    request = InputRequest.objects.filter(pk=request_id).first()
    if request is None:
        return False
    return expire_input(request) if expired else cancel_input(request)


def expire_input(request: InputRequest) -> bool:
    """pending -> expired (the server is told `decline`); False when an answer got there first."""
    return _close(request, InputRequestStatus.EXPIRED, InputRequestAction.DECLINE, by="timeout")


def cancel_input(request: InputRequest, *, by: str = "interrupt") -> bool:
    """pending -> cancelled (the server is told `cancel`): the turn was interrupted, or the call
    that asked is gone. False when an answer got there first."""
    return _close(request, InputRequestStatus.CANCELLED, InputRequestAction.CANCEL, by=by)


def cancel_open_requests(session) -> int:
    """Cancel every pending request of `session` (the caller holds its lock): nobody waits for
    them any more (an interrupt was applied, or a lost runner's call is being closed)."""
    cancelled = 0
    for request in InputRequest.objects.filter(session_id=session.pk, status=InputRequestStatus.PENDING):
        if _close(
            request, InputRequestStatus.CANCELLED, InputRequestAction.CANCEL, by="interrupt", session=session
        ):
            cancelled += 1
    return cancelled


# --- a person's side ------------------------------------------------------------------------


def answer_input(request: InputRequest, action: str, content=None, *, user) -> InputRequest:
    """A person's answer (REST, WebSocket, browser): the one entry for all three.

    Raises InvalidAnswer (content does not fit the schema; nothing written), AlreadyAnswered
    (not pending any more — one past its deadline is expired here and then refused)."""
    if action not in ANSWERS:
        raise InvalidAnswer({"action": [f"Use one of {', '.join(InputRequestAction.values)}."]})
    if request.status != InputRequestStatus.PENDING:
        raise AlreadyAnswered(request)
    if request.expires_at <= timezone.now():
        # The waiting handler expires it on its next poll anyway; nobody may answer it meanwhile.
        expire_input(request)
        request.refresh_from_db()
        raise AlreadyAnswered(request)
    accepted = None
    if action == InputRequestAction.ACCEPT:
        accepted = validate_answer(request.schema, content if content is not None else {})
    by = user.get_username() if getattr(user, "is_authenticated", False) else "system"
    if not _close(request, ANSWERS[action], action, by=by, user=user, content=accepted):
        request.refresh_from_db()
        raise AlreadyAnswered(request)
    request.refresh_from_db()
    return request


def _close(
    request: InputRequest, status: str, action: str, *, by: str, user=None, content=None, session=None
) -> bool:
    """pending -> `status` once (compare-and-set) with its `input.answered`, under the Session lock
    (`session`: the caller already holds it)."""

    def close(locked) -> bool:
        won = InputRequest.objects.filter(pk=request.pk, status=InputRequestStatus.PENDING).update(
            status=status,
            action=action,
            content=content,
            answered_at=timezone.now(),
            answered_by=user if getattr(user, "is_authenticated", False) else None,
        )
        if not won:
            return False
        logger.info("input request %s %s by %s", request.pk, status, by)
        emit(
            locked,
            "input.answered",
            {"request_id": request.pk, "action": str(action), "status": str(status), "by": by},
        )
        return True

    if session is not None:
        return close(session)
    with locked_session(request.session_id) as locked:
        return close(locked)


# --- the schema -------------------------------------------------------------------------------


def validate_answer(schema: dict, content) -> dict:
    """`content` checked against an MCP elicitation schema; returns it (unchanged). Raises
    InvalidAnswer with every field's problems. Unknown fields are refused: the server asked for
    exactly these."""
    if not isinstance(content, dict):
        raise InvalidAnswer({"content": ["Must be an object of the requested fields."]})
    properties = schema.get("properties") if isinstance(schema, dict) else None
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required") if isinstance(schema, dict) else None
    required = [name for name in required if isinstance(name, str)] if isinstance(required, list) else []
    errors: dict[str, list[str]] = {}
    for name in required:
        if name not in content or content[name] is None:
            errors.setdefault(name, []).append("This field is required.")
    for name, value in content.items():
        if name not in properties:
            errors.setdefault(str(name)[:100], []).append("The request did not ask for this field.")
            continue
        if value is None:
            continue  # an optional field left empty
        problems = _field_problems(properties[name] if isinstance(properties[name], dict) else {}, value)
        if problems:
            errors.setdefault(name, []).extend(problems)
    if errors:
        raise InvalidAnswer(errors)
    return content


# PostgreSQL's jsonb cannot hold "\u0000": an answer with it is invalid, not a database error.
NUL = "\x00"
NUL_PROBLEM = "Must not contain NUL characters."


def _choices(prop: dict) -> list | None:
    if isinstance(prop.get("enum"), list):
        return prop["enum"]
    options = prop.get("oneOf") or prop.get("anyOf")
    if isinstance(options, list):
        return [o.get("const") for o in options if isinstance(o, dict) and "const" in o]
    return None


def _field_problems(prop: dict, value) -> list[str]:
    kind = prop.get("type")
    if kind == "string":
        if not isinstance(value, str):
            return ["Must be a string."]
        if NUL in value:
            return [NUL_PROBLEM]
        choices = _choices(prop)
        if choices is not None:
            return [] if value in choices else [f"Must be one of: {', '.join(map(str, choices))}."]
        return _string_problems(prop, value)
    if kind in ("number", "integer"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return ["Must be a number."]
        if kind == "integer" and not float(value).is_integer():
            return ["Must be a whole number."]
        problems = []
        if isinstance(prop.get("minimum"), (int, float)) and value < prop["minimum"]:
            problems.append(f"Must be at least {prop['minimum']}.")
        if isinstance(prop.get("maximum"), (int, float)) and value > prop["maximum"]:
            problems.append(f"Must be at most {prop['maximum']}.")
        return problems
    if kind == "boolean":
        return [] if isinstance(value, bool) else ["Must be true or false."]
    if kind == "array":
        items = prop.get("items") if isinstance(prop.get("items"), dict) else {}
        choices = _choices(items)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return ["Must be a list of strings."]
        if any(NUL in v for v in value):
            return [NUL_PROBLEM]
        problems = []
        if choices is not None and any(v not in choices for v in value):
            problems.append(f"Each must be one of: {', '.join(map(str, choices))}.")
        if isinstance(prop.get("minItems"), int) and len(value) < prop["minItems"]:
            problems.append(f"Choose at least {prop['minItems']}.")
        if isinstance(prop.get("maxItems"), int) and len(value) > prop["maxItems"]:
            problems.append(f"Choose at most {prop['maxItems']}.")
        return problems
    return ["The request's schema for this field is not one this product can answer."]


def _string_problems(prop: dict, value: str) -> list[str]:
    problems = []
    limit = prop.get("maxLength") if isinstance(prop.get("maxLength"), int) else MAX_STRING_CHARS
    if len(value) > min(limit, MAX_STRING_CHARS):
        problems.append(f"Must be at most {min(limit, MAX_STRING_CHARS)} characters.")
    if isinstance(prop.get("minLength"), int) and len(value) < prop["minLength"]:
        problems.append(f"Must be at least {prop['minLength']} characters.")
    fmt = prop.get("format")
    if fmt == "email" and not EMAIL.match(value):
        problems.append("Must be an email address.")
    elif fmt == "uri" and not URI.match(value):
        problems.append("Must be a URI (scheme:rest).")
    elif fmt == "date" and not _parses(date.fromisoformat, value):
        problems.append("Must be a date (YYYY-MM-DD).")
    elif fmt == "date-time" and not _parses(datetime.fromisoformat, value):
        problems.append("Must be a date and time (ISO 8601).")
    return problems


def _parses(parse, value: str) -> bool:
    try:
        parse(value)
    except ValueError:
        return False
    return True
