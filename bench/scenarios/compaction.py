"""A 300-step turn that outgrows a small context window, through the real `openai` client and
the scripted server on loopback: every step reads a ~2 KB file, so the history grows ~500
tokens a step and the runtime compacts every few steps.

Reported: the largest request the server received against the budget (by the server's own
count: what a provider would bill), how flat requests stay (mean of the last 10% over the first
10% after the first compaction), the number of compactions, and compaction latency (from
`compaction.started` to `compaction.committed`, which includes the summary call on loopback).
"""

from __future__ import annotations

import json
import statistics

from tests.support.model_server import ScriptedModelServer, json_reply, text_reply, tool_call, tool_reply

from ..figures import figure, target
from ..harness import median_of_runs, new_owner, new_session, percentile, run_turn_in_process, window_mean

FULL_STEPS, QUICK_STEPS = 300, 60
WINDOW, MAX_OUTPUT = 8000, 1000
FILES = 20
STATE = {
    "goal": "read the files in turn",
    "deliverables": [],
    "progress": ["read files in turn"],
    "decisions": [],
    "constraints": [],
    "open_questions": [],
    "next_actions": ["keep reading"],
    "artifacts": [],
    "active_user_request": "read the files in turn",
}


def run(options: dict) -> dict:
    from django.conf import settings

    steps = QUICK_STEPS if options["quick"] else FULL_STEPS
    settings.XAGENT_MAX_STEPS_PER_TURN = steps + 10
    runs = [measure_turn(steps) for _ in range(options["runs"])]
    return {"figures": figures(runs), "details": {"steps": steps, "runs": runs}}


def measure_turn(steps: int) -> dict:
    from sessions_app.models import ModelConfig, SessionEvent
    from sessions_app.runtime import engine
    from sessions_app.runtime.llm.tokens import context_budget

    tenant, owner = new_owner("compaction")
    budget = context_budget(WINDOW, MAX_OUTPUT)
    with ScriptedModelServer() as server:
        config = ModelConfig.objects.create(
            tenant=tenant,
            name="scripted-small",
            base_url=server.base_url,
            model="scripted-model",
            context_window=WINDOW,
            max_output_tokens=MAX_OUTPUT,
            configured_by_operator=True,
        )
        served = {"agent": 0}

        def agent(request):
            served["agent"] += 1
            if served["agent"] > steps:
                return text_reply("Read them all.")
            index = served["agent"] % FILES
            return tool_reply(tool_call("fs_read", {"path": f"file_{index:02}.txt"}))

        server.default("agent", agent)
        server.default("summary", json_reply(STATE))
        session = new_session(tenant, owner, "compaction bench", config)
        workspace = engine.workspace_path(session)
        for index in range(FILES):
            (workspace / f"file_{index:02}.txt").write_text(f"file {index}: " + "lorem ipsum dolor " * 110)
        run_turn_in_process(session, "Read the files in turn.", steps)
        requests = server.requests_for("agent")

    counts = [server_count(r) for r in requests]
    events = SessionEvent.objects.filter(session=session, type__startswith="compaction.").order_by("seq")
    started = {e.data["checkpoint_id"]: e.created_at for e in events if e.type == "compaction.started"}
    latencies = [
        (
            e.created_at - started[e.data.get("discarded_checkpoint_id", e.data["checkpoint_id"])]
        ).total_seconds()
        * 1000
        for e in events
        if e.type == "compaction.committed"
    ]
    first = next((i for i, r in enumerate(requests) if "Continuity state" in r.messages[0]["content"]), None)
    after = counts[first:] if first is not None else []
    return {
        "largest_over_budget": max(counts) / budget,
        "over_budget": sum(1 for c in counts if c > budget),
        "flatness": window_mean(after, 0.1, last=True) / window_mean(after, 0.1, last=False)
        if after
        else None,
        "compactions": len(latencies),
        "latency_median": statistics.median(latencies) if latencies else None,
        "latency_p95": percentile(latencies, 0.95) if latencies else None,
    }


def server_count(request) -> int:
    """The scripted server's own count of a request (what it reports as prompt tokens)."""
    return -(-len(json.dumps(request.messages, ensure_ascii=False) + json.dumps(request.tools)) // 4)


def figures(runs: list[dict]) -> list[dict]:
    def median(key):
        return median_of_runs(runs, key)

    return [
        figure("largest request / budget", median("largest_over_budget"), "×", target("<=", 1.0)),
        figure("requests over budget", median("over_budget"), "", target("<=", 0)),
        figure(
            "flatness after the 1st compaction, last/first 10%",
            median("flatness"),
            "×",
            target("<=", 1.2),
            note="no compaction happened",
        ),
        figure("compactions in the turn", median("compactions"), ""),
        figure("compaction latency, median", median("latency_median"), "ms"),
        figure("compaction latency, p95", median("latency_p95"), "ms"),
    ]
