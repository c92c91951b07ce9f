"""Long-term Memory, the one owner of `Memory` rows (ARCHITECTURE §1): what a user's Sessions
remember across Sessions, per user and tenant, never shared.

Written by the `memory_save` tool (through the runtime's port), searched by `memory_search`,
recalled at task setup (`recall_for_task`, when a turn starts from a user message: the ids are
kept on the turn and the texts enter every request of that turn as a labelled block), listed and
deleted by the user through the API, read by admins in admin.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from skills_app.recall import Document, rank

from ..choices import MemoryKind
from ..models import Memory

# How many of the user's memories recall and search consider (the most recently used first).
CANDIDATES = 500
# At task setup: the best matches for the request, then the latest standing preferences and
# constraints (they apply whatever the request says), within a character budget.
RECALL_MATCHES = 6
RECALL_STANDING = 4
RECALL_MAX_CHARS = 6000
STANDING_KINDS = (MemoryKind.PREFERENCE, MemoryKind.CONSTRAINT)


class MemoryRefused(ValueError):
    """The save was refused (empty, too long, unknown kind, the user's memory is full)."""


def for_user(tenant_id: int, user_id: int):
    """The one read path of a user's memories in a tenant."""
    return Memory.objects.for_tenant(tenant_id).filter(user_id=user_id)


def max_per_user() -> int:
    return settings.XAGENT_MEMORY_MAX_PER_USER


def _normalized(text: str) -> str:
    return " ".join(text.split())


def save(
    *, tenant_id: int, user_id: int, text: str, kind: str, source_session_id=None
) -> tuple[Memory, bool]:
    """Remember `text` for this user. The same text of the same kind again refreshes the existing
    memory (returns it, created False) instead of storing a duplicate."""
    text = _normalized(str(text))
    if not text:
        raise MemoryRefused("a memory needs some text")
    if len(text) > Memory.MAX_TEXT:
        raise MemoryRefused(f"a memory is at most {Memory.MAX_TEXT} characters (this one has {len(text)})")
    if kind not in MemoryKind.values:
        raise MemoryRefused(f"kind must be one of {', '.join(MemoryKind.values)}")
    with transaction.atomic():
        existing = for_user(tenant_id, user_id).filter(kind=kind, text=text).select_for_update().first()
        if existing is not None:
            existing.source_session_id = source_session_id or existing.source_session_id
            existing.save(update_fields=["source_session", "updated_at"])
            return existing, False
        if for_user(tenant_id, user_id).count() >= max_per_user():
            raise MemoryRefused(
                f"this user already has {max_per_user()} memories; they can delete old ones "
                "(Memories page or DELETE /api/v1/memories/{id}/) before more are saved"
            )
        memory = Memory.objects.create(
            tenant_id=tenant_id, user_id=user_id, kind=kind, text=text, source_session_id=source_session_id
        )
        return memory, True


def _candidates(tenant_id: int, user_id: int, kind: str | None = None) -> list[Memory]:
    rows = for_user(tenant_id, user_id)
    if kind:
        rows = rows.filter(kind=kind)
    return list(rows.only("id", "kind", "text", "updated_at")[:CANDIDATES])


def _documents(memories: list[Memory]) -> list[Document]:
    # Zero-padded ids as refs: ties go to the older memory, always the same way.
    return [
        Document(ref=f"{m.pk:012d}", fields={"text": m.text, "kind": m.kind}, payload=m) for m in memories
    ]


def search(
    *, tenant_id: int, user_id: int, query: str, kind: str | None = None, limit: int = 10
) -> list[Memory]:
    """The user's memories matching `query`, best first; with no usable terms, the latest."""
    candidates = _candidates(tenant_id, user_id, kind)
    found = [doc.payload for doc in rank(query, _documents(candidates), limit)]
    return found if found or query.strip() else candidates[:limit]


def recall_for_task(*, tenant_id: int, user_id: int, request_text: str) -> list[int]:
    """The memories to set a new task up with: the best matches for the request, then the
    latest standing preferences and constraints; ids, best first."""
    candidates = _candidates(tenant_id, user_id)
    if not candidates:
        return []
    chosen = [doc.payload for doc in rank(request_text, _documents(candidates), RECALL_MATCHES)]
    standing = [m for m in candidates if m.kind in STANDING_KINDS and m not in chosen][:RECALL_STANDING]
    picked, used = [], 0
    for memory in [*chosen, *standing]:
        if used + len(memory.text) > RECALL_MAX_CHARS:
            continue
        picked.append(memory.pk)
        used += len(memory.text)
    return picked


def texts(tenant_id: int, user_id: int | None, ids: list[int]) -> list[Memory]:
    """The recalled memories still there (a user may delete one mid-turn), in recall order."""
    if not ids or user_id is None:
        return []
    rows = {m.pk: m for m in for_user(tenant_id, user_id).filter(pk__in=ids).only("id", "kind", "text")}
    return [rows[i] for i in ids if i in rows]


def as_dict(memory: Memory) -> dict:
    return {
        "id": memory.pk,
        "kind": memory.kind,
        "text": memory.text,
        "saved_at": memory.updated_at.isoformat(),
    }


def forget(memory: Memory) -> None:
    """The user deleted it: gone for good (later requests no longer show it, even mid-turn)."""
    memory.delete()
