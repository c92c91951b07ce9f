"""Approval decide → the original tool ran, on the real stack: the zero-latency model writes a
draft, then deletes it (`fs_delete_files`: destructive, so the default policy parks the turn);
the benchmark decides through `POST /approvals/{id}/decide/` and watches the Session's socket.

Two figures per decision, from the moment the decide request was sent: until the deletion's
result row was written (`tool.ended`'s `ts`, i.e. the worker picked the decision up and ran the
call) and until the client saw that event.
"""

from __future__ import annotations

import time

from ..figures import figure, target
from ..harness import add_default_tools, api_key_for, median_of_runs, new_owner, new_session, percentile
from ..models import directive_message
from ..stack import api_client, event_time, live_stack, session_stream

DRAFT = "draft.md"
WRITE_THEN_DELETE = [
    [{"name": "fs_write", "arguments": {"path": DRAFT, "content": "scratch"}}],
    [{"name": "fs_delete_files", "arguments": {"paths": [DRAFT]}}],
]
FULL_DECISIONS = 20
QUICK_DECISIONS = 5


def run(options: dict) -> dict:
    tenant, owner = new_owner("approvals")
    add_default_tools(tenant, ["fs_delete_files"])
    key = api_key_for(tenant, owner)
    decisions = QUICK_DECISIONS if options["quick"] else FULL_DECISIONS
    with live_stack() as address, api_client(address, key) as api:
        measure_session(address, api, key, tenant, owner, 2)  # warm-up
        runs = [measure_session(address, api, key, tenant, owner, decisions) for _ in range(options["runs"])]
    goal = target("<=", 250, "ms")
    return {
        "figures": [
            figure("decide → tool result committed, p50", median_of_runs(runs, "ran_p50_ms"), "ms"),
            figure("decide → tool result committed, p95", median_of_runs(runs, "ran_p95_ms"), "ms", goal),
            figure("decide → client sees tool.ended, p50", median_of_runs(runs, "seen_p50_ms"), "ms"),
            figure("decide → client sees tool.ended, p95", median_of_runs(runs, "seen_p95_ms"), "ms", goal),
            figure("decide request (REST), p50", median_of_runs(runs, "request_p50_ms"), "ms"),
        ],
        "details": runs,
    }


def measure_session(address, api, key, tenant, owner, decisions: int) -> dict:
    """`decisions` turns in one Session, each parked once and approved."""
    session = new_session(tenant, owner, "approvals")
    timings = []
    with session_stream(address, key, session.pk) as stream:
        for _ in range(decisions):
            api.post(
                f"/sessions/{session.pk}/inputs/", json={"text": directive_message(2, WRITE_THEN_DELETE)}
            ).raise_for_status()
            requested = stream.wait_for(lambda f: f["type"] == "approval.requested")[0]["data"]
            timings.append(approve_and_watch(api, stream, requested))
            stream.wait_for(lambda f: f["type"] == "turn.ended")
    request_ms, ran_ms, seen_ms = (list(column) for column in zip(*timings, strict=True))
    return {
        "decisions": decisions,
        "ran_p50_ms": percentile(ran_ms, 0.50),
        "ran_p95_ms": percentile(ran_ms, 0.95),
        "seen_p50_ms": percentile(seen_ms, 0.50),
        "seen_p95_ms": percentile(seen_ms, 0.95),
        "request_p50_ms": percentile(request_ms, 0.50),
    }


def approve_and_watch(api, stream, requested: dict) -> tuple[float, float, float]:
    """Milliseconds from sending the decision to: its answer, the result row, the client seeing it."""
    sent = time.time()
    api.post(
        f"/approvals/{requested['approval_id']}/decide/", json={"decision": "approve"}
    ).raise_for_status()
    answered = time.time()
    ended, arrived = stream.wait_for(
        lambda f: f["type"] == "tool.ended" and f["data"]["call_id"] == requested["call_id"]
    )
    return (answered - sent) * 1000, (event_time(ended) - sent) * 1000, (arrived - sent) * 1000
