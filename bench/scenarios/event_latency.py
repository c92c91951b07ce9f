"""Commit → WebSocket client latency: a client subscribed to a Session on the real stack, while
a worker runs a turn of zero-latency-model steps that emits a few hundred events.

Latency = the time the frame arrived minus its `ts`. `ts` is stamped when the event row is
written, inside the transaction, so the figure also holds the rest of that transaction and its
commit: an upper bound on commit → client. Frames from the log backlog are not counted.
"""

from __future__ import annotations

import time

from ..figures import figure, target
from ..harness import api_key_for, median_of_runs, new_owner, new_session, percentile
from ..models import directive_message
from ..stack import api_client, event_time, live_stack, session_stream

FULL_STEPS = 60  # ≈ 5 events per step: a few hundred events per run
QUICK_STEPS = 20


def run(options: dict) -> dict:
    tenant, owner = new_owner("events")
    key = api_key_for(tenant, owner)
    steps = QUICK_STEPS if options["quick"] else FULL_STEPS
    with live_stack() as address:
        measure_turn(address, key, tenant, owner, 3)  # warm-up: first requests, imports in the worker
        runs = [measure_turn(address, key, tenant, owner, steps) for _ in range(options["runs"])]
    return {
        "figures": [
            figure("events per run", median_of_runs(runs, "events"), ""),
            figure("latency p50", median_of_runs(runs, "p50_ms"), "ms"),
            figure("latency p95", median_of_runs(runs, "p95_ms"), "ms", target("<=", 50, "ms")),
            figure("latency p99", median_of_runs(runs, "p99_ms"), "ms"),
        ],
        "details": runs,
    }


def measure_turn(address: str, key: str, tenant, owner, steps: int) -> dict:
    session = new_session(tenant, owner, f"events {steps}")
    latencies = []
    with session_stream(address, key, session.pk) as stream, api_client(address, key) as api:
        sent = time.time()
        api.post(
            f"/sessions/{session.pk}/inputs/", json={"text": directive_message(steps)}
        ).raise_for_status()
        while True:
            frame, arrived = stream.receive()
            written = event_time(frame)
            if written is not None and written >= sent:
                latencies.append((arrived - written) * 1000)
            if frame["type"] == "turn.ended":
                break
    return {
        "events": len(latencies),
        "p50_ms": percentile(latencies, 0.50),
        "p95_ms": percentile(latencies, 0.95),
        "p99_ms": percentile(latencies, 0.99),
    }
