"""Which Skills a tenant's Sessions see, and what loading one gives them (ARCHITECTURE §2,
progressive disclosure): until a Skill is loaded only its name and description are offered;
loading attaches its body (and read-only access to its resources) to the Session.

A Skill is usable by a tenant when it is enabled and is the tenant's own or global; a tenant's
Skill hides a global one of the same name. Loaded Skills are recorded on the Session by name
(SessionEngine owns that), so a newer version or a disabled flag applies from the next request.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models.functions import Length

from .models import Skill, SkillFile, SkillVersion
from .packaging import read_resource as read_file
from .recall import Document, rank

# Offered by name and description in every request; past this, skills_find finds the rest.
MAX_OFFERED = 30


@dataclass(frozen=True)
class SkillBrief:
    id: int
    name: str
    description: str
    version: int


@dataclass(frozen=True)
class LoadedSkill:
    id: int
    name: str
    version: int
    body: str
    resources: tuple[tuple[str, int], ...]  # (path, size), SKILL.md aside
    skill_md_size: int = 0


def visible(tenant_id: int):
    """The Skills a tenant sees, enabled or not: its own and the global ones its own do not hide
    (a tenant's Skill hides the global one of the same name, even when disabled: turning your own
    off does not bring the operator's back). The one place that rule lives (API and runtime)."""
    own_names = Skill.objects.filter(tenant_id=tenant_id).values("name")
    return Skill.objects.for_tenant(tenant_id).exclude(tenant__isnull=True, name__in=own_names)


def _usable(tenant_id: int, *, names=None, fields=None) -> list[Skill]:
    """Enabled visible Skills (one per name), ordered by name."""
    rows = visible(tenant_id).filter(enabled=True).order_by("name")
    if names is not None:
        rows = rows.filter(name__in=list(names))
    if fields:
        rows = rows.only(*fields, "name")
    return list(rows)


def usable_skills(tenant_id: int) -> list[SkillBrief]:
    rows = _usable(tenant_id, fields=("id", "description", "version"))
    return [SkillBrief(s.pk, s.name, s.description, s.version) for s in rows]


def offered(tenant_id: int, exclude=()) -> tuple[list[SkillBrief], int]:
    """The Skills a request names (not loaded ones), at most MAX_OFFERED, and how many more exist."""
    excluded = set(exclude)
    briefs = [b for b in usable_skills(tenant_id) if b.name not in excluded]
    return briefs[:MAX_OFFERED], max(0, len(briefs) - MAX_OFFERED)


def find(tenant_id: int, query: str, exclude=(), limit: int = 10) -> list[SkillBrief]:
    """Usable Skills matching `query`, best first (by the recall scorer over name and description)."""
    excluded = set(exclude)
    documents = [
        Document(
            ref=brief.name,
            fields={"name": brief.name.replace("-", " "), "description": brief.description},
            weights={"name": 2.0},
            payload=brief,
        )
        for brief in usable_skills(tenant_id)
        if brief.name not in excluded
    ]
    return [doc.payload for doc in rank(query, documents, limit)]


def resolve(tenant_id: int, refs) -> tuple[list[SkillBrief], list[str]]:
    """Split references a model gave (names, or ids as numbers or strings) into the usable Skills
    they name and the ones that name nothing this tenant may use."""
    refs = [str(r).strip() for r in refs]
    ids = [int(r) for r in refs if r.isdigit()]
    usable = usable_skills(tenant_id)
    by_name = {b.name: b for b in usable}
    by_id = {b.id: b for b in usable if b.id in ids}
    found: dict[str, SkillBrief] = {}
    unknown = []
    for ref in refs:
        brief = by_name.get(ref) or (by_id.get(int(ref)) if ref.isdigit() else None)
        if brief is None:
            unknown.append(ref)
        else:
            found.setdefault(brief.name, brief)
    return list(found.values()), unknown


def loaded(tenant_id: int, names) -> list[LoadedSkill]:
    """The current body and resources of the named Skills still usable (two queries)."""
    skills = _usable(tenant_id, names=names)
    files: dict[int, list[tuple[str, int]]] = {}
    version_ids = [s.current_version_id for s in skills if s.current_version_id]
    for version_id, path, size in (
        SkillFile.objects.filter(version_id__in=version_ids)
        .order_by("path")
        .values_list("version_id", "path", "size")
    ):
        files.setdefault(version_id, []).append((path, size))
    sizes = dict(
        SkillVersion.objects.filter(pk__in=version_ids)
        .annotate(size=Length("skill_md"))
        .values_list("pk", "size")
    )
    order = {name: i for i, name in enumerate(names)}
    return [
        LoadedSkill(
            s.pk,
            s.name,
            s.version,
            s.body,
            tuple(files.get(s.current_version_id, ())),
            sizes.get(s.current_version_id) or 0,
        )
        for s in sorted(skills, key=lambda s: order.get(s.name, 0))
    ]


@dataclass
class LoadDecision:
    """Which of the Skills a model asked for may be loaded (`accepted`, with their bodies) and
    which not (`rejected`: `{"skill", "reason"}`)."""

    accepted: list[LoadedSkill]
    rejected: list[dict]

    def result(self, newly_added) -> dict:
        """What `skills_load` answers, once the Session has the accepted ones."""
        return {
            "accepted_skill_ids": [s.id for s in self.accepted],
            "loaded": [
                {
                    "id": s.id,
                    "name": s.name,
                    "version": s.version,
                    "already_loaded": s.name not in newly_added,
                    "resources": [f"skills/{s.name}/{path}" for path, _ in s.resources],
                }
                for s in self.accepted
            ],
            "rejected": self.rejected,
        }


def choose_to_load(
    tenant_id: int, refs, *, loaded_now: list[LoadedSkill], room_tokens: int, cost
) -> LoadDecision:
    """The usable Skills among `refs` that fit: loaded Skills' instructions together may take
    `room_tokens` (counted with `cost(text) -> tokens`); one already loaded costs nothing again."""
    found, unknown = resolve(tenant_id, refs)
    rejected = [{"skill": ref, "reason": "no usable skill by that name or id"} for ref in unknown]
    current = {skill.name for skill in loaded_now}
    room = room_tokens - sum(cost(skill.body) for skill in loaded_now)
    bodies = {skill.name: skill for skill in loaded(tenant_id, [brief.name for brief in found])}
    accepted = []
    for brief in found:
        skill = bodies.get(brief.name)
        if skill is None:  # disabled between the two reads
            rejected.append({"skill": brief.name, "reason": "no usable skill by that name or id"})
            continue
        if skill.name not in current:
            needed = cost(skill.body)
            if needed > room:
                rejected.append(
                    {
                        "skill": skill.name,
                        "reason": f"its instructions (~{needed} tokens) do not fit the room this model "
                        f"leaves for loaded skills (~{max(room, 0)} tokens)",
                    }
                )
                continue
            room -= needed
        accepted.append(skill)
    return LoadDecision(accepted, rejected)


class ResourceNotFound(LookupError):
    pass


def read_resource(tenant_id: int, name: str, path: str) -> bytes:
    """A file (SKILL.md or a resource) of the usable Skill `name`'s current version, by its path."""
    skills = _usable(tenant_id, names=[name], fields=("current_version",))
    content = read_file(skills[0], path) if skills else None
    if content is None:
        raise ResourceNotFound(f"{name}/{path}")
    return content
