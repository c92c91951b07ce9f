"""Sessions, their capabilities and their input queue."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from ...choices import InputKind, InputStatus, SessionKind, SessionStatus
from ...models import Input, Message, Session, SessionCapability, Turn
from ..events import emit
from .fencing import locked_session

# What a runner has to do (`has_pending_work`, `pending_work`, the recovery sweep's look for a
# Session left without one): with no turn open, an input that starts one or an interrupt; with
# a turn open, the turn itself while it advances, or what moves it once it is parked for a human.
TURN_STARTING_KINDS = (InputKind.MESSAGE, InputKind.GUIDANCE, InputKind.SESSION_EVENT)
WORK_WITHOUT_A_TURN = (*TURN_STARTING_KINDS, InputKind.INTERRUPT)
WORK_FOR_A_PARKED_TURN = (InputKind.INTERRUPT, InputKind.APPROVAL_DECISION)
ADVANCING_STATUSES = (SessionStatus.RUNNING, SessionStatus.PREPARING, SessionStatus.QUEUED)


class InvalidInput(ValueError):
    pass


def workspace_path(session: Session) -> Path:
    return workspace_dir(session.tenant_id, session.pk)


def workspace_dir(tenant_id: int, session_id) -> Path:
    return Path(settings.XAGENT_WORKSPACES_DIR) / str(tenant_id) / str(session_id)


# --- sessions and inputs -----------------------------------------------------------------------


def create_session(
    *, tenant, owner, title="", goal="", kind=SessionKind.MAIN, parent=None, model_config=None
) -> Session:
    with transaction.atomic():
        session = Session.objects.create(
            tenant=tenant,
            owner=owner,
            title=title[:200],
            session_goal=goal,
            kind=kind,
            parent=parent,
            model_config=model_config,
        )
        emit(session, "session.status", {"status": session.status})
        from approvals_app.policy import ensure_default_policy
        from tools_app.models import ToolSet

        # A tenant's first Session seeds the default policy (destructive/external need approval),
        # so no tenant ever runs without one; admins edit it from there.
        ensure_default_policy(tenant)

        defaults = list(
            ToolSet.objects.for_tenant(tenant).filter(is_default=True).values_list("name", flat=True)
        )
        if defaults:
            _add_capabilities(session, toolsets=defaults, added_by="default")
    workspace_path(session).mkdir(parents=True, exist_ok=True)
    return session


# --- capabilities ------------------------------------------------------------------------------


def session_capabilities(session_id) -> dict[str, list[str]]:
    found = {"tools": [], "toolsets": [], "skills": []}
    for kind, name in SessionCapability.objects.filter(session_id=session_id).values_list("kind", "name"):
        found[f"{kind}s"].append(name)
    return found


def _add_capabilities(
    session: Session, *, tools=(), toolsets=(), skills=(), added_by: str
) -> dict[str, list[str]]:
    existing = {
        (k, n) for k, n in SessionCapability.objects.filter(session=session).values_list("kind", "name")
    }
    added = {"skills": [], "tools": [], "toolsets": []}
    rows = []
    for kind, names in (("tool", tools), ("toolset", toolsets), ("skill", skills)):
        for name in dict.fromkeys(names):
            if (kind, name) not in existing:
                rows.append(
                    SessionCapability(
                        tenant_id=session.tenant_id,
                        session=session,
                        kind=kind,
                        name=name,
                        added_by=added_by[:50],
                    )
                )
                added[f"{kind}s"].append(name)
    if rows:
        SessionCapability.objects.bulk_create(rows)
        session.config_version += 1
        Session.objects.filter(pk=session.pk).update(config_version=session.config_version)
        # `after_message_id` (an extension): where in the conversation it happened, for clients.
        last_message = (
            Message.objects.filter(session=session).order_by("-id").values_list("id", flat=True).first()
        )
        emit(session, "capabilities.added", {**added, "after_message_id": last_message})
    return added


def add_selected_capabilities(session_id, token, *, tools=(), toolsets=(), skills=(), added_by: str) -> dict:
    """Attach capabilities to the Session: atomic and add-only (nothing is ever removed here)."""
    with locked_session(session_id, token) as session:
        return _add_capabilities(session, tools=tools, toolsets=toolsets, skills=skills, added_by=added_by)


def enqueue_input(
    session_id, *, kind: str, payload: dict, idempotency_key: str | None = None, user=None, caller: str = ""
) -> tuple[Input, bool]:
    """Commit an input to the queue (it can never be lost after this). Returns (input, created).

    The same idempotency key again from the same caller (`key:<id>` or `user:<id>`; default:
    the user) returns that caller's first input and queues nothing; another caller's key of the
    same name is theirs alone.
    """
    if kind not in InputKind.values:
        raise InvalidInput(f"unknown input kind {kind!r}")
    caller = caller or _caller_of(user)
    with locked_session(session_id) as session:
        if idempotency_key:
            existing = Input.objects.filter(
                session=session, caller=caller, idempotency_key=idempotency_key
            ).first()
            if existing is not None:
                return existing, False
        return queue_input(
            session, kind=kind, payload=payload, idempotency_key=idempotency_key, user=user, caller=caller
        ), True


def _caller_of(user) -> str:
    return f"user:{user.pk}" if getattr(user, "is_authenticated", False) else ""


def queue_input(
    session: Session, *, kind: str, payload: dict, idempotency_key=None, user=None, caller: str = ""
) -> Input:
    """`enqueue_input` for a caller that already holds the Session lock (its events share the
    caller's batch: a second lock inside would number them twice)."""
    created = Input.objects.create(
        tenant_id=session.tenant_id,
        session=session,
        kind=kind,
        payload=payload,
        idempotency_key=idempotency_key or None,
        caller=caller or _caller_of(user),
        created_by=user if getattr(user, "is_authenticated", False) else None,
    )
    emit(session, "input.queued", {"input_id": created.pk, "kind": kind})
    return created


def update_session(session_id, *, title: str | None = None) -> Session:
    with locked_session(session_id) as session:
        if title is not None:
            session.title = title[:200]
            session.save(update_fields=["title", "updated_at"])
    return session


def archive_session(session_id) -> bool:
    """Archive the Session (it leaves every list and route). True when a turn was still open:
    the caller stops it (Brain queues an interrupt), since nobody can reach it any more."""
    with locked_session(session_id) as session:
        if session.archived_at is None:
            session.archived_at = timezone.now()
            session.save(update_fields=["archived_at", "updated_at"])
            emit(session, "session.archived", {})
        return session.current_turn_id is not None


def restore_session(session_id) -> bool:
    """Bring an archived Session back into the lists and routes, as it was (its turn, if one was
    open, was interrupted when it was archived). True when it was archived."""
    with locked_session(session_id) as session:
        if session.archived_at is None:
            return False
        session.archived_at = None
        session.save(update_fields=["archived_at", "updated_at"])
        emit(session, "session.restored", {})
        return True


def queued_inputs(session_id, kinds=None):
    qs = Input.objects.filter(session_id=session_id, status=InputStatus.QUEUED)
    if kinds is not None:
        qs = qs.filter(kind__in=list(kinds))
    return qs.order_by("id")


def has_pending_work(session: Session) -> bool:
    """True while a runner has something to do: an open turn to advance or an input it can take.

    A turn parked for a human (waiting_approval) is not work: only an interrupt moves it.
    """
    if session.current_turn_id is not None:
        if session.status in ADVANCING_STATUSES:
            return True
        return queued_inputs(session.pk, WORK_FOR_A_PARKED_TURN).exists()
    return queued_inputs(session.pk, WORK_WITHOUT_A_TURN).exists()


def pending_work() -> Q:
    """`has_pending_work` as a filter on Sessions, for a statement that must decide in the
    database (the runner's one-statement release). The two say the same; a test holds them so."""

    def queued(kinds):
        return Exists(
            Input.objects.filter(session_id=OuterRef("pk"), status=InputStatus.QUEUED, kind__in=kinds)
        )

    return (
        Q(current_turn__isnull=False, status__in=ADVANCING_STATUSES)
        | Q(current_turn__isnull=False) & queued(WORK_FOR_A_PARKED_TURN)
        | Q(current_turn__isnull=True) & queued(WORK_WITHOUT_A_TURN)
    )


def consume_inputs(inputs: list[Input], turn: Turn | None) -> None:
    Input.objects.filter(pk__in=[i.pk for i in inputs], status=InputStatus.QUEUED).update(
        status=InputStatus.CONSUMED, consumed_at=timezone.now(), turn=turn
    )
