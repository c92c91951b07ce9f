"""History: the append-only messages of a Session, their wire form, and the request history a
runner slice keeps in memory.

Only the lease holder appends messages, so a slice reads the request's history once and then
appends what it commits itself (`RequestHistory`); a step's cost does not grow with history
except for sending the body. Each message's token estimate is stored when it is committed and
its JSON encoding made once, when it joins a slice's history; the messages digest recorded on
every model call is a running hash chain over those encodings.
"""

from __future__ import annotations

import hashlib
import json
import re

from ...choices import InputKind, Role
from ...models import Input, Message, Session
from ..events import emit
from ..llm.base import EncodedMessages
from ..llm.tokens import estimate_message_tokens
from .fencing import RunnerWriter
from .rows import insert_row

# Guidance is stored as the person wrote it; the request frames it.
GUIDANCE_FRAME = "[Guidance from the user while you work — take it into account from this step on]\n"

# What the model sends is stored as it came, except NUL: PostgreSQL text and jsonb cannot hold it.
# In a call's arguments it becomes the JSON escape (the model reads back what it sent, and
# ToolService has refused the call at parse_arguments); in prose, U+FFFD.
NUL = "\x00"


# Lone surrogates (a model may send "\ud800" as a JSON escape) cannot be stored either (UTF-8).
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def without_nul(value, replacement: str = "\ufffd"):
    """`value` (text or JSON-like data) with every NUL and lone surrogate in its strings and keys
    replaced: what PostgreSQL can store."""
    if isinstance(value, str):
        if NUL in value:
            value = value.replace(NUL, replacement)
        return _LONE_SURROGATE.sub(replacement, value)
    if isinstance(value, dict):
        return {without_nul(k, replacement): without_nul(v, replacement) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_nul(item, replacement) for item in value]
    return value


def _stored_call(call: dict) -> dict:
    arguments = call.get("arguments")
    if isinstance(arguments, str) and NUL in arguments:
        call = {**call, "arguments": arguments.replace(NUL, "\\u0000")}
    return without_nul(call)


def wire_message(
    role: str, content: str, *, tool_calls=(), tool_call_id: str = "", input_kind: str | None = None
) -> dict:
    """A message as the Chat Completions API takes it."""
    if role == Role.ASSISTANT:
        wire = {"role": "assistant", "content": content or None}
        if tool_calls:
            wire["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in tool_calls
            ]
        return wire
    if role == Role.TOOL:
        return {"role": "tool", "tool_call_id": tool_call_id, "content": content}
    if input_kind == InputKind.GUIDANCE:
        content = GUIDANCE_FRAME + content
    return {"role": role, "content": content}


def _wire_of(message: Message, input_kind: str | None) -> dict:
    return wire_message(
        message.role,
        message.content,
        tool_calls=message.tool_calls,
        tool_call_id=message.tool_call_id,
        input_kind=input_kind,
    )


def append_message(session: Session, turn_id: int | None, role: str, content: str = "", **fields) -> Message:
    """Commit one message (the caller's transaction holds the Session) and announce it."""
    input = fields.get("input")
    wire = wire_message(
        role,
        content,
        tool_calls=fields.get("tool_calls") or (),
        tool_call_id=fields.get("tool_call_id", ""),
        input_kind=input.kind if input is not None else None,
    )
    message = insert_row(
        Message(
            tenant_id=session.tenant_id,
            session_id=session.pk,
            turn_id=turn_id,
            role=role,
            content=content,
            token_estimate=estimate_message_tokens(wire),
            **fields,
        )
    )
    message.wire = wire  # for the slice's RequestHistory: not recomputed, not re-read
    emit(session, "message.committed", {"message_id": message.pk, "role": role})
    return message


class RequestHistory:
    """The slice's copy of what the next request sends: the system message, the active turn's
    anchor when a compaction moved the context start past it, then the history from the
    context start. Read once (`load`), caught up cheaply after the slice re-reads at a step
    boundary (`catch_up`), and appended to as the slice commits (`add`). Keeps each history
    message's id, role and token estimate, so a compaction can choose its boundary from here."""

    def __init__(self):
        self.messages = EncodedMessages()
        self.set_system("")  # index 0 is always the system message
        self.context_start_id: int | None = None
        self.anchor_id: int | None = None
        self.anchor_tokens = 0
        self.ids: list[int] = []
        self.roles: list[str] = []
        self.tokens: list[int] = []
        self.first_id: int | None = None
        self.last_id: int | None = None
        self.history_tokens = 0
        self.digest = ""
        self.loaded = False

    @property
    def count(self) -> int:
        return max(len(self.messages) - 1, 0)

    def set_system(self, text: str) -> None:
        self.messages.set_first({"role": "system", "content": text})

    def load(self, session_id, context_start_id: int | None, anchor_id: int | None = None) -> None:
        self.messages.truncate(1)
        self.ids, self.roles, self.tokens = [], [], []
        self.first_id = self.last_id = None
        self.history_tokens, self.digest = 0, ""
        self.context_start_id, self.anchor_id, self.anchor_tokens = context_start_id, anchor_id, 0
        if anchor_id is not None:
            anchor = self._rows(session_id, Message.objects.filter(pk=anchor_id))
            for message in anchor:
                self._append(message)
                self.anchor_tokens = message.token_estimate
        self._read(session_id, context_start_id)
        self.loaded = True

    def catch_up(self, session_id, context_start_id: int | None, anchor_id: int | None = None) -> None:
        """Messages committed since the slice last looked (by its own locked operations)."""
        if not self.loaded or context_start_id != self.context_start_id or anchor_id != self.anchor_id:
            self.load(session_id, context_start_id, anchor_id)
        else:
            after_last = self.last_id + 1 if self.last_id is not None else None
            self._read(session_id, max(after_last or 0, context_start_id or 0) or None)

    def _read(self, session_id, from_id: int | None) -> None:
        rows = Message.objects.filter(session_id=session_id)
        if from_id:
            rows = rows.filter(id__gte=from_id)
        for message in self._rows(session_id, rows):
            self.add(message)

    @staticmethod
    def _rows(session_id, rows):
        fields = ("id", "role", "content", "tool_calls", "tool_call_id", "token_estimate", "input__kind")
        for row in rows.order_by("id").values(*fields):
            message = Message(
                pk=row["id"],
                role=row["role"],
                content=row["content"],
                tool_calls=row["tool_calls"],
                tool_call_id=row["tool_call_id"],
                token_estimate=row["token_estimate"],
            )
            message.wire = _wire_of(message, row["input__kind"])
            yield message

    def add(self, message: Message) -> None:
        """A history message (from the context start on) joins the request."""
        self._append(message)
        self.ids.append(message.pk)
        self.roles.append(message.role)
        self.tokens.append(message.token_estimate or estimate_message_tokens(message.wire))

    def _append(self, message: Message) -> None:
        wire = getattr(message, "wire", None) or _wire_of(message, None)
        message.wire = wire
        if not message.token_estimate:
            message.token_estimate = estimate_message_tokens(wire)
        encoded = json.dumps(wire, ensure_ascii=False)
        self.messages.append_encoded(wire, encoded)
        self.history_tokens += message.token_estimate
        self.digest = hashlib.sha256(f"{self.digest}\n{encoded}".encode()).hexdigest()
        if self.first_id is None:
            self.first_id = message.pk
        self.last_id = message.pk

    def wire_span(self, start: int, stop: int) -> list[dict]:
        """The wire messages of history positions [start, stop) (ids[start:stop])."""
        offset = 2 if self.anchor_id is not None else 1
        return list(self.messages[offset + start : offset + stop])


def turn_request(turn_id: int | None) -> Message | None:
    """The user message a turn started from: the anchor a compaction keeps sending."""
    if turn_id is None:
        return None
    return (
        Message.objects.filter(turn_id=turn_id, role=Role.USER).order_by("id").only("id", "content").first()
    )


def goal_round_of(turn_id: int | None) -> dict | None:
    """`{"goal_run_id", "round"}` when the turn runs a goal run's round (its input says so, as
    the goal driver queued it), else None."""
    if turn_id is None:
        return None
    for payload in Input.objects.filter(turn_id=turn_id).values_list("payload", flat=True):
        if (found := goal_round_in(payload)) is not None:
            return found
    return None


def goal_round_in(payload) -> dict | None:
    """`{"goal_run_id", "round"}` when an input's payload queues a goal run's round."""
    if isinstance(payload, dict) and payload.get("goal_run_id"):
        return {"goal_run_id": payload["goal_run_id"], "round": payload.get("round")}
    return None


# --- the step phases of a slice (fenced by its RunnerWriter) ---------------------------------------


def commit_tool_result(writer: RunnerWriter, turn_id: int, **result) -> Message:
    """Commit the result of one tool call (the second half of its pair) in its own fenced
    commit: `record_tool_result`'s message and event."""
    with writer.commit(one_statement=True) as session:
        return record_tool_result(session, turn_id, **result)


def record_tool_result(
    session: Session,
    turn_id: int | None,
    *,
    call_id: str,
    tool: str,
    content: str,
    ok: bool,
    summary: str,
    source: dict | None = None,
) -> Message:
    """`tool.ended` and the tool message of one call (caller holds the Session). `source` names
    where it ran when that is not this process, e.g. {"server", "tool"} for MCP."""
    content, summary = without_nul(content), without_nul(summary)
    emit(
        session,
        "tool.ended",
        {
            "call_id": call_id,
            "tool": tool,
            "ok": ok,
            "summary": summary,
            "turn_id": turn_id,
            **({"source": source} if source else {}),
        },
    )
    return append_message(
        session, turn_id, Role.TOOL, content, tool_call_id=call_id, tool_name=tool, is_error=not ok
    )


def stored_calls(tool_calls: list[dict]) -> list[dict]:
    return [_stored_call(call) for call in tool_calls]


INTERRUPTED_CALL_TEXT = (
    "Interrupted: the runner stopped before this call's result was recorded. It was not run again; "
    "it may or may not have taken effect, so check before repeating it."
)


def has_unanswered_calls(messages) -> bool:
    """Does the request history end with a response whose tool calls are not all answered? Read
    from the slice's in-memory wire messages, so the check costs no query (it runs at every
    step boundary; only recovery leaves calls unanswered in a running turn)."""
    answered = set()
    for wire in reversed(messages):
        if wire.get("role") == "tool":
            answered.add(wire.get("tool_call_id"))
            continue
        calls = wire.get("tool_calls") if wire.get("role") == "assistant" else None
        return bool(calls) and any(call["id"] not in answered for call in calls)
    return False


def unanswered_calls(turn_id: int) -> tuple[int, list[dict]] | None:
    """(assistant message id, its calls without a result, in model order) for the turn's last
    response with tool calls, or None when every call has its result."""
    last_call = (
        Message.objects.filter(turn_id=turn_id, role=Role.ASSISTANT)
        .exclude(tool_calls=[])
        .order_by("-id")
        .only("id", "tool_calls")
        .first()
    )
    if last_call is None:
        return None
    answered = set(
        Message.objects.filter(turn_id=turn_id, role=Role.TOOL, id__gt=last_call.pk).values_list(
            "tool_call_id", flat=True
        )
    )
    pending = [call for call in last_call.tool_calls if call.get("id") not in answered]
    return (last_call.pk, pending) if pending else None
