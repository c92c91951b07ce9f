"""Main and sub-Sessions (ARCHITECTURE §2): a MainSession hands a task to a sub-Session with the
original request and resource references only (files copied into the sub-Session's workspace);
the sub-Session understands and runs it with its own outer loop (the parent never chooses its
Skills or tools); when the delegated turn ends, its result — final answer and delivery record —
returns to the MainSession as a `session_event` input, which starts a turn there.

Locks are taken child first, then parent (the report); delegating holds no lock while it
creates the child, so the two never wait on each other in opposite orders.
"""

from __future__ import annotations

import logging
import uuid

from django.conf import settings
from django.db import transaction

from tools_app.base import ToolError
from tools_app.workspace import copy_file, resolve_in_workspace

from ...choices import InputKind, SessionKind, TurnReason
from ...models import Delivery, Input, Session, Turn
from ..events import emit
from ..scheduling import wake
from .fencing import locked_session
from .sessions import archive_session, create_session, queue_input, workspace_dir, workspace_path

logger = logging.getLogger(__name__)

MAX_REPORTED_ANSWER_CHARS = 6000
SESSION_EVENT_HEADER = "[Session event: not a message from the user]"


class DelegationRefused(ToolError):
    pass


def _limits() -> dict:
    return {
        "max_bytes": settings.XAGENT_UPLOAD_MAX_BYTES,
        "max_files": settings.XAGENT_WORKSPACE_MAX_FILES,
        "max_workspace_bytes": settings.XAGENT_WORKSPACE_MAX_BYTES,
    }


def delegate(
    main_session_id, *, request: str, files=(), sub_session_id=None, title: str = "", call_id: str = ""
) -> dict:
    """Send `request` (and copies of `files` of the MainSession's workspace) to a new sub-Session,
    or to `sub_session_id`, one of its own. Returns what the tool reports; the caller wakes the
    sub-Session's runner once this has committed (`on_commit` is registered here)."""
    main = Session.objects.select_related("tenant", "owner", "model_config").get(pk=main_session_id)
    if main.kind != SessionKind.MAIN:
        raise DelegationRefused(
            "only a MainSession delegates; a sub-Session does its task itself", code="not_a_main_session"
        )
    if sub_session_id:
        child = (
            Session.objects.filter(
                tenant_id=main.tenant_id,
                parent_id=main.pk,
                kind=SessionKind.SUB,
                # A colleague's sub-Session under this one is theirs: their memory, their work.
                owner_id=main.owner_id,
                archived_at__isnull=True,
            )
            .filter(pk=_uuid_or_none(sub_session_id))
            .first()
        )
        if child is None:
            raise DelegationRefused(
                f"no sub-Session {str(sub_session_id)[:60]!r} of this Session; omit session_id to start one",
                code="not_found",
            )
        reused = True
    else:
        child = None
        reused = False
    files = list(dict.fromkeys(files))
    limits = _limits()
    for path in files:  # checked before anything is created
        try:
            source = resolve_in_workspace(workspace_path(main), path, must_exist=True)
            if not source.is_file():
                raise ToolError(f"{path!r} is not a file", code="not_a_file")
            if source.stat().st_size > limits["max_bytes"]:
                raise ToolError(
                    f"it is over the {limits['max_bytes']:,}-byte limit of a file handed over",
                    code="file_too_large",
                )
        except ToolError as exc:
            raise DelegationRefused(f"{path!r} cannot be handed over: {exc}", code=exc.code) from exc
    if child is None:
        first_line = request.strip().splitlines()[0] if request.strip() else ""
        child = create_session(
            tenant=main.tenant,
            owner=main.owner,
            title=(title.strip() or first_line or "Delegated task")[:200],
            kind=SessionKind.SUB,
            parent=main,
            model_config=main.model_config,
        )
    copied = []
    for path in files:
        try:
            copied.append(
                (path, copy_file(workspace_path(main), path, workspace_path(child), path, **limits))
            )
        except (ToolError, OSError) as exc:
            if not reused:
                archive_session(child.pk)  # nothing was sent to it: no empty sub-Session left behind
            raise DelegationRefused(f"{path!r} could not be handed over: {exc}", code="file_refused") from exc
    with locked_session(child.pk) as locked_child:
        for path, op in copied:
            # Announced as handed over (`by`), so the sub-Session's delivery does not count
            # them as its own work.
            emit(locked_child, "file.changed", {"path": path, "op": op, "by": f"MainSession {main.pk}"})
        created = queue_input(
            locked_child,
            kind=InputKind.MESSAGE,
            payload={
                "text": request,
                **({"attachments": [path for path, _ in copied]} if copied else {}),
                "delegated_by": str(main.pk),
                **({"delegated_call_id": call_id} if call_id else {}),
            },
            # The MainSession's owner asks (the sub-Session's memory is theirs alike).
            user=main.owner,
        )
        transaction.on_commit(lambda: _wake(child.pk))
    return {
        "session_id": str(child.pk),
        "title": child.title,
        "input_id": created.pk,
        "reused": reused,
        "files": [path for path, _ in copied],
    }


def _uuid_or_none(value):
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def _wake(session_id) -> None:
    wake(session_id)  # after commit only


def delegated_by(turn: Turn) -> str | None:
    """The MainSession that delegated the task `turn` works on (from the input that started it)."""
    payload = Input.objects.filter(turn_id=turn.pk).order_by("id").values_list("payload", flat=True).first()
    return (payload or {}).get("delegated_by")


def report_to_parent(session: Session, turn: Turn, reason: str, detail: str = "") -> Input | None:
    """A delegated turn of a sub-Session ended (caller holds the sub-Session's lock): its result
    goes back to the MainSession as a `session_event` input — the final answer and the delivery
    record; delivered files are copied under `from-<sub-Session id>/` in the MainSession's
    workspace. Nothing happens for a turn nobody delegated (a person talking to the sub-Session
    directly)."""
    if session.parent_id is None or delegated_by(turn) != str(session.parent_id):
        return None
    parent = Session.objects.filter(pk=session.parent_id, archived_at__isnull=True).first()
    if parent is None:
        return None
    delivery = Delivery.objects.filter(turn_id=turn.pk).first()
    folder = f"from-{str(session.pk)[:8]}"
    copied, not_copied = [], []
    for entry in delivery.files if delivery is not None else []:
        target = f"{folder}/{entry['path']}"
        try:
            op = copy_file(
                workspace_dir(session.tenant_id, session.pk),
                entry["path"],
                workspace_dir(parent.tenant_id, parent.pk),
                target,
                **_limits(),
            )
            copied.append((target, op, entry))
        except (ToolError, OSError) as exc:
            not_copied.append(f"{entry['path']} ({exc})")
    text = _report_text(session, turn, reason, detail, delivery, [c[0] for c in copied], not_copied)
    with locked_session(parent.pk) as locked_parent:
        for target, op, _ in copied:
            emit(locked_parent, "file.changed", {"path": target, "op": op, "by": f"sub-Session {session.pk}"})
        created = queue_input(
            locked_parent,
            kind=InputKind.SESSION_EVENT,
            payload={
                "text": text,
                "event": "sub_session.finished",
                "session_id": str(session.pk),
                "turn_id": turn.pk,
                "reason": reason,
                "delivery_id": delivery.pk if delivery is not None else None,
                "files": [target for target, _, _ in copied],
            },
        )
    transaction.on_commit(lambda: _wake(parent.pk))
    return created


def _report_text(session, turn, reason, detail, delivery, copied, not_copied) -> str:
    outcome = "finished" if reason == TurnReason.COMPLETED else f"stopped ({reason})"
    lines = [
        SESSION_EVENT_HEADER,
        f'The sub-Session "{session.title}" ({session.pk}) {outcome} the task you delegated'
        + (f": {detail}" if detail else "."),
    ]
    if delivery is not None:
        answer = delivery.final_answer.strip()
        if len(answer) > MAX_REPORTED_ANSWER_CHARS:
            answer = answer[:MAX_REPORTED_ANSWER_CHARS] + " …[clipped]"
        lines += ["", "Its final answer:", answer or "(none)"]
        if copied:
            lines += ["", "Files it delivered, copied into this workspace:", *(f"- {p}" for p in copied)]
        if not_copied:
            lines += ["", "Files not copied:", *(f"- {p}" for p in not_copied)]
        failed = [c for c in delivery.checks if not c.get("ok")]
        if failed:
            lines += ["", "Checks that failed:", *(f"- {c['path']}: {c.get('detail', '')}" for c in failed)]
        if delivery.unresolved_failures:
            lines += [
                "",
                "Unresolved tool failures:",
                *(f"- {f['tool']}: {f.get('summary', '')}" for f in delivery.unresolved_failures),
            ]
    return "\n".join(lines)
