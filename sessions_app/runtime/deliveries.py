"""What a turn delivered: gathered from committed facts and the workspace, never from what the
model says about it. SessionEngine (`engine.finish_turn`) stores the result as a `Delivery`.

- files: every file the turn's `file.changed` events name, plus every file modified since the
  turn started (a shell command or an MCP tool may write without announcing it), with size
  and sha256 as they are on disk at the end of the turn;
- checks: `sessions_app.artifacts.check_file` on each of them (real parsers);
- unresolved failures: each failed tool call of the turn that no later successful call of the
  same tool on the same target made good.

Everything in the record is redacted with the tenant's secrets before it is stored: a program an
admin gave a secret may have written it into a delivered file (ARCHITECTURE §7), and the record
reaches members, the API, admin pages, goal runs and parent Sessions.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from django.db.models import Case, ExpressionWrapper, F, IntegerField, Q, Subquery, TextField, Value, When

from approvals_app.choices import ApprovalStatus
from approvals_app.models import PendingApproval
from tools_app.secrets import Redactor, tenant_redactor
from tools_app.service import DENIED_BY_POLICY
from tools_app.workspace import list_tree

from .. import artifacts
from ..choices import Role
from ..models import Message, SessionEvent, Turn

MAX_DELIVERED_FILES = 100
MAX_HASH_BYTES = 256 * 1024 * 1024
MAX_WALK_ENTRIES = 10_000
# How far before the turn's start a person's upload is looked for (events, not time).
PERSON_LOOKBACK_EVENTS = 500
# The kernel stamps mtimes from a coarse clock that may lag the turn's start by a tick: a file
# written in the turn's first instant still counts. Files a person uploaded just before the turn
# are told apart by their `file.changed` event, not by time.
MTIME_SLACK_S = 0.05
SUMMARY_CHARS = 300


@dataclass
class DeliveryFacts:
    final_answer: str
    files: list[dict]
    checks: list[dict]
    unresolved_failures: list[dict]
    decisions: list[dict]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        for block in iter(lambda: fh.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def _changed_paths(turn: Turn, workspace: Path) -> list[str]:
    """Files the turn's tools created or changed.

    Announced changes count unless a person made them (`file.changed` with `by`: an upload or a
    delete through the files API, before or during the turn). Files modified since the turn
    started count too, unless a person is the last to have announced them: a tool that writes
    without announcing (a shell command, an MCP server) is still seen.
    """
    # One query: the turn's `turn.started` and the `file.changed` events from PERSON_LOOKBACK_EVENTS
    # before it on, in order (none at all when the turn never started).
    started_seq = SessionEvent.objects.filter(
        session_id=turn.session_id, type="turn.started", data__turn_id=turn.pk
    ).values("seq")[:1]
    window = SessionEvent.objects.filter(
        session_id=turn.session_id,
        type__in=("turn.started", "file.changed"),
        seq__gt=ExpressionWrapper(
            Subquery(started_seq) - PERSON_LOOKBACK_EVENTS, output_field=IntegerField()
        ),
    ).order_by("seq")
    started = None
    by_tools: dict[str, str] = {}
    last_by_person: set[str] = set()
    for seq, type_, data in window.values_list("seq", "type", "data"):
        if type_ == "turn.started":
            if isinstance(data, dict) and data.get("turn_id") == turn.pk:
                started = seq
            continue
        if not isinstance(data, dict) or not isinstance(data.get("path"), str):
            continue
        path = data["path"]
        if data.get("by"):
            last_by_person.add(path)
            by_tools.pop(path, None)
        else:
            last_by_person.discard(path)
            if started is not None and seq > started:
                by_tools[path] = data.get("op", "")
    paths = {path for path, op in by_tools.items() if op != "deleted"}
    if workspace.is_dir():
        since = turn.started_at.timestamp() - MTIME_SLACK_S
        for entry in list_tree(workspace, max_entries=MAX_WALK_ENTRIES):
            if entry["kind"] != "file" or entry["path"] in last_by_person or entry["path"] in paths:
                continue
            if os.stat(workspace / entry["path"], follow_symlinks=False).st_mtime >= since:
                paths.add(entry["path"])
    return sorted(paths)


def _target(raw_arguments) -> str:
    """What a call acts on, so a later success on the same thing resolves an earlier failure."""
    try:
        arguments = json.loads(raw_arguments) if isinstance(raw_arguments, str) else raw_arguments
    except ValueError:
        return f"raw:{raw_arguments}"
    if isinstance(arguments, dict):
        for key in ("path", "paths", "file", "url", "command"):
            if key in arguments:
                return json.dumps(arguments[key], sort_keys=True)
    return json.dumps(arguments, sort_keys=True)


def _decided_calls(turn_id: int) -> dict[str, dict]:
    """The turn's calls a person rejected or let expire, by call id: {"decision", "by", "comment"}."""
    rows = PendingApproval.objects.filter(
        turn_id=turn_id, status__in=[ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED]
    ).select_related("decided_by")
    return {
        row.call_id: {
            "decision": str(row.status),
            "by": row.decided_by.get_username() if row.decided_by_id else None,
            "comment": row.comment or "",
        }
        for row in rows
    }


def _decision_of(call_id: str, content: str, decided: dict[str, dict]) -> dict | None:
    """A failed result that is a decision (a person's rejection or expiry, a deny rule), or None."""
    if call_id in decided:
        return decided[call_id]
    if content.startswith(DENIED_BY_POLICY):
        return {"decision": "denied", "by": None, "comment": content[len(DENIED_BY_POLICY) :][:SUMMARY_CHARS]}
    return None


def unresolved_failures(turn_id: int, decisions: list | None = None) -> list[dict]:
    """The turn's failed calls no later success on the same tool and target made good. Calls that
    did not run by a decision (rejected, expired, denied) are not failures: they go to
    `decisions` when a list is given."""
    return _read_messages(turn_id, decisions if decisions is not None else [])[0]


def _read_messages(turn_id: int, decisions: list) -> tuple[list[dict], str]:
    """One pass over the turn's assistant and tool messages: its unresolved failures (decisions
    appended to `decisions`) and its final answer (the last assistant text)."""
    calls: dict[str, tuple[str, str]] = {}
    failures: list[tuple[str, str, str, str]] = []  # (call_id, tool, target, summary)
    decided = None  # read at the first failed result: most turns have none
    answer = ""
    # Only the texts read here come back: a successful tool result (a file read, a listing) can
    # be large and nothing of it is needed.
    needed = Case(
        When(Q(role=Role.ASSISTANT) | Q(is_error=True), then=F("content")),
        default=Value(""),
        output_field=TextField(),
    )
    rows = (
        Message.objects.filter(turn_id=turn_id, role__in=[Role.ASSISTANT, Role.TOOL])
        .order_by("id")
        .only("role", "tool_calls", "tool_call_id", "tool_name", "is_error")
        .annotate(needed_content=needed)
    )
    for message in rows:
        content = message.needed_content or ""
        if message.role == Role.ASSISTANT:
            answer = content or answer
            for call in message.tool_calls or []:
                calls[call.get("id", "")] = (
                    call.get("name", ""),
                    _target(call.get("arguments")),
                )
            continue
        tool, target = calls.get(message.tool_call_id, (message.tool_name, ""))
        if message.is_error:
            if decided is None:
                decided = _decided_calls(turn_id)
            decision = _decision_of(message.tool_call_id, content, decided)
            if decision is not None:
                decisions.append({"call_id": message.tool_call_id, "tool": tool, **decision})
                continue
            summary = content.strip().splitlines()[0] if content.strip() else "failed"
            failures.append((message.tool_call_id, tool, target, summary[:SUMMARY_CHARS]))
        else:
            failures = [f for f in failures if not (f[1] == tool and f[2] == target)]
    unresolved = [
        {"call_id": call_id, "tool": tool, "summary": summary} for call_id, tool, _, summary in failures
    ]
    return unresolved, answer


def gather(turn: Turn, workspace: Path, redactor: Redactor | None = None) -> DeliveryFacts:
    """Everything a delivery record holds; reads the workspace, so call it outside the Session lock.
    `redactor`: the runner slice's (the tenant's secrets as the slice read them), else read here."""
    redactor = redactor if redactor is not None else tenant_redactor(turn.tenant_id)
    files, checks = [], []
    for rel in _changed_paths(turn, workspace)[:MAX_DELIVERED_FILES]:
        path = workspace / rel
        try:
            size = path.stat().st_size
            # A file the shell made huge is listed, not hashed: the worker must not stall on it.
            digest = _sha256(path) if size <= MAX_HASH_BYTES else ""
        except OSError:
            continue  # gone again before the end of the turn
        # A file name is the program's to choose too.
        files.append({"path": redactor.redact(rel), "size": size, "sha256": digest})
        checks.append(redactor.redact_data(artifacts.check_file(path, rel, redactor).as_dict()))
    decisions: list[dict] = []
    failures, answer = _read_messages(turn.pk, decisions)
    return DeliveryFacts(
        final_answer=redactor.redact(answer),
        files=files,
        checks=checks,
        unresolved_failures=redactor.redact_data(failures),
        decisions=redactor.redact_data(decisions),
    )
