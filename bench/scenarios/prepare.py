"""The outer loop's harness cost: what preparing a sub-Session's turn (ARCHITECTURE §2) costs
besides the model — the task-relation call's evidence and transition, recall over Skills, tool
sets and memories, the orchestrate call's evidence and the add-only commit — with the
in-process zero-latency model (answers at once), over a catalogue of 300 Skills, 50 tool sets
and 500 memories. Recall runs side by side (threads) and one after the other; the figures say
what each costs and that the query count does not grow with the catalogue.
"""

from __future__ import annotations

import statistics
import time
import uuid

from django.db import connection
from django.test.utils import CaptureQueriesContext

from ..figures import figure, target
from ..harness import new_owner
from . import recall as recall_scenario

SKILLS = 300
TOOLSETS = 50
TASK = "Research the weekly support tickets and deliver a markdown report with kpi charts"


def run(options: dict) -> dict:
    from django.conf import settings

    tenant, owner = new_owner("prepare")
    recall_scenario._add_skills(tenant, 0, SKILLS)
    _add_toolsets(tenant)
    recall_scenario._add_memories(tenant, owner)
    main = _session(tenant, owner, None)
    figures, details = [], {}
    for parallel in (True, False):
        settings.XAGENT_RECALL_PARALLEL = parallel
        _prepare(tenant, owner, main)  # warm-up (imports, caches, connections)
        runs = [_prepare(tenant, owner, main) for _ in range(max(options["runs"], 3) * 3)]
        label = "recall side by side" if parallel else "recall one after the other"
        details[label] = runs
        figures.append(figure(f"prepare a turn, {label}", statistics.median(r["ms"] for r in runs), "ms"))
        figures.append(figure(f"queries, {label}", max(r["queries"] for r in runs), "", target("<=", 50)))
    return {"figures": figures, "details": details}


def _session(tenant, owner, parent):
    from sessions_app.runtime import engine

    kind = "main" if parent is None else "sub"
    return engine.create_session(tenant=tenant, owner=owner, title=f"bench {kind}", kind=kind, parent=parent)


def _prepare(tenant, owner, main) -> dict:
    """One sub-Session turn up to its first step: start the turn, then time the preparation."""
    from sessions_app.runtime import brain, engine, outer_loop
    from sessions_app.runtime.agent import AgentService

    session = _session(tenant, owner, main)
    engine.enqueue_input(session.pk, kind="message", payload={"text": TASK}, user=owner)
    token = brain.acquire(session.pk)
    (queued,) = engine.queued_inputs(session.pk)
    turn = engine.start_turn(session.pk, token, queued)
    agent = AgentService(session.pk, token)
    try:
        # Threads' queries are not captured here: the figure counts the preparing thread's own.
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            outer_loop.prepare_turn(agent, turn.pk)
            ms = (time.perf_counter() - started) * 1000
    finally:
        agent.close()
        brain.release(session.pk, token, keep_if_work=False)
    status = type(session).objects.filter(pk=session.pk).values_list("status", flat=True).get()
    if status != "running":
        raise RuntimeError(f"the turn was not prepared (status {status})")
    return {"ms": ms, "queries": len(queries.captured_queries)}


def _add_toolsets(tenant) -> None:
    from tools_app.models import Tool, ToolSet

    shell = Tool.objects.get(tenant=None, name="shell_exec")
    for i in range(TOOLSETS):
        words = " ".join(recall_scenario.WORDS[(i * 5 + k) % len(recall_scenario.WORDS)] for k in range(5))
        toolset = ToolSet.objects.create(
            tenant=tenant, name=f"bench-set-{i}-{uuid.uuid4().hex[:4]}", description=f"Tools for {words}"
        )
        toolset.tools.add(shell)
