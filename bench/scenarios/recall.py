"""Recall cost: `skills_find` over a tenant's Skills (BM25 in Python over name + description)
and the memories recalled at task setup (BM25 over the user's latest 500), as the catalogue
grows. Both run once per tool call / per turn, never per step; the figures say what that costs
and that the query count does not grow with the catalogue.
"""

from __future__ import annotations

import statistics
import time

from django.db import connection
from django.test.utils import CaptureQueriesContext

from ..figures import figure, target
from ..harness import new_owner

SKILL_COUNTS = (30, 300, 1000)
MEMORIES = 500
QUERY = "build the weekly support report from the tickets export"
WORDS = "report tickets csv guide research pdf markdown weekly kpi support data clean chart api docs".split()


def run(options: dict) -> dict:
    tenant, owner = new_owner("recall")
    figures, details = [], {}
    imported = 0
    for count in SKILL_COUNTS:
        imported = _add_skills(tenant, imported, count)
        ms, queries = _timed(options["runs"], lambda: _find(tenant))
        details[f"skills_{count}"] = {"ms": ms, "queries": queries}
        figures.append(figure(f"skills_find over {count} Skills", statistics.median(ms), "ms"))
    figures.append(
        figure(
            "skills_find queries (any catalogue size)",
            max(d["queries"] for k, d in details.items() if k.startswith("skills_")),
            "",
            target("<=", 1),
        )
    )
    _add_memories(tenant, owner)
    ms, queries = _timed(options["runs"], lambda: _recall(tenant, owner))
    details["memories"] = {"ms": ms, "queries": queries}
    figures.append(figure(f"memory recall at task setup ({MEMORIES} memories)", statistics.median(ms), "ms"))
    figures.append(figure("memory recall queries", queries, "", target("<=", 1)))
    return {"figures": figures, "details": details}


def _find(tenant):
    from skills_app import catalog

    return catalog.find(tenant.pk, QUERY, limit=5)


def _recall(tenant, owner):
    from sessions_app.runtime import memory

    return memory.recall_for_task(tenant_id=tenant.pk, user_id=owner.pk, request_text=QUERY)


def _timed(runs: int, call) -> tuple[list[float], int]:
    call()  # warm-up
    with CaptureQueriesContext(connection) as queries:
        call()
    ms = []
    for _ in range(max(runs, 3) * 5):
        started = time.perf_counter()
        call()
        ms.append((time.perf_counter() - started) * 1000)
    return ms, len(queries.captured_queries)


def _description(i: int) -> str:
    picked = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(6)]
    return f"Skill {i} handles {' '.join(picked)} tasks and deliver the result, checked."


def _add_skills(tenant, have: int, want: int) -> int:
    from skills_app import packaging

    for i in range(have, want):
        text = f"---\nname: bench-skill-{i}\ndescription: {_description(i)}\n---\n# Skill {i}\n\nSteps.\n"
        packaging.import_package(packaging.read_skill_md(text), tenant=tenant, by="bench", origin="seed")
    return want


def _add_memories(tenant, owner) -> None:
    from sessions_app.runtime import memory

    kinds = ("entity", "topic", "preference", "constraint", "decision")
    for i in range(MEMORIES):
        memory.save(
            tenant_id=tenant.pk,
            user_id=owner.pk,
            text=f"Memory {i}: {_description(i)}",
            kind=kinds[i % len(kinds)],
        )
