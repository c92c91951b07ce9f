"""Step overhead through the real `openai` client: the Session's ModelConfig points at the
scripted OpenAI-compatible server (tests/support/model_server.py) on loopback, in this process.

The server answers with the same script as the zero-latency model (bench.models.next_calls).
Per step it sees the harness from outside: the gap between the end of one response and the
next request, which includes the client's own work (request building, stream parsing) but
not the loopback transfer of the response itself.
"""

from __future__ import annotations

import statistics

from tests.support.model_server import ScriptedModelServer, text_reply, tool_call, tool_reply

from ..figures import figure, target
from ..harness import median_of_runs, new_owner, new_session, run_turn_in_process, step_intervals, window_mean
from ..models import FINAL_ANSWER, directive_message, next_calls
from ..probe import CALL_LOG

FULL_SIZES = (10, 500)
QUICK_SIZES = (10, 100)
TARGET_MS = {10: 10, 500: 15}
WINDOW = 0.10


def scripted_reply(request):
    """The zero-latency model's answer, over HTTP; stamped like the in-process model's."""
    CALL_LOG.stamp()
    calls = next_calls(request.messages)
    if not calls:
        return text_reply(FINAL_ANSWER)
    return tool_reply([tool_call(c["name"], c["arguments"], id=c["id"]) for c in calls])


def run(options: dict) -> dict:
    from sessions_app.models import ModelConfig

    tenant, owner = new_owner("openai")
    sizes = QUICK_SIZES if options["quick"] else FULL_SIZES
    figures, details = [], {}
    with ScriptedModelServer() as server:
        server.default("agent", scripted_reply)
        config = ModelConfig.objects.create(
            tenant=tenant,
            name="scripted",
            base_url=server.base_url,
            model="scripted-model",
            context_window=128000,
            max_output_tokens=1024,
            configured_by_operator=True,  # the operator's own loopback server: not behind the outbound guard
        )
        measure_turn(server, tenant, owner, config, 5)  # warm-up: imports, the client, connections
        for steps in sizes:
            runs = [measure_turn(server, tenant, owner, config, steps) for _ in range(options["runs"])]
            details[f"N={steps}"] = runs
            figures += figures_for(steps, runs)
    return {"figures": figures, "details": details}


def measure_turn(server, tenant, owner, config, steps: int) -> dict:
    server.reset()
    server.default("agent", scripted_reply)
    run_turn_in_process(new_session(tenant, owner, f"{steps} steps", config), directive_message(steps), steps)
    requests = server.requests_for("agent")
    gaps = [(b.received_at - a.finished_at) * 1000 for a, b in zip(requests, requests[1:], strict=False)]
    millis, queries = step_intervals()
    return {
        "steps": len(gaps),
        "gap_ms_mean": statistics.fmean(gaps),
        "gap_ms_last": window_mean(gaps, WINDOW, last=True),
        "growth": window_mean(gaps, WINDOW, last=True) / window_mean(gaps, WINDOW, last=False),
        "wall_ms_mean": statistics.fmean(millis),
        "queries_last": window_mean(queries, WINDOW, last=True),
    }


def figures_for(steps: int, runs: list[dict]) -> list[dict]:
    def median(key):
        return median_of_runs(runs, key)

    at = f"N={steps}"
    goal = target("<=", TARGET_MS[steps], "ms") if steps in TARGET_MS else None
    return [
        figure(f"{at}: ms/step, server-side gap, mean", median("gap_ms_mean"), "ms", goal),
        figure(f"{at}: ms/step, server-side gap, last 10%", median("gap_ms_last"), "ms"),
        figure(f"{at}: growth, last/first 10%", median("growth"), "×", target("<=", 1.3, "×")),
        figure(f"{at}: ms/step, wall (request to request)", median("wall_ms_mean"), "ms"),
        figure(f"{at}: queries/step, last 10%", median("queries_last"), "", target("<=", 12)),
    ]
