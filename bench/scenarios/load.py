"""200 Sessions × 20 steps on 2 worker processes (production mode: PostgreSQL + Redis).

Two `celery -A config worker` processes (each with the pool and concurrency the settings choose,
bench.stack.workers) with the zero-latency model; every Session gets one message asking for 20
tool-call steps, all queued at once. The runtime's own scheduling (bounded slices that
re-enqueue) shares the workers between them.

* steps/s: all tool-call steps / (last turn ended − first message queued);
* step latency: time between consecutive model calls of one Session (`ModelCall.started_at`),
  which includes waiting for a worker — what a person watching that Session sees;
* fairness: max/min steps done across the Sessions when half of all steps are done.
"""

from __future__ import annotations

import math
import statistics
import time

from ..figures import figure, target
from ..harness import median_of_runs, new_owner, new_session, percentile
from ..models import directive_message
from ..stack import workers

FULL_SHAPE = (200, 20)  # Sessions, steps each
QUICK_SHAPE = (50, 10)
WORKER_PROCESSES = 2
POLL_S = 0.2
TIMEOUT_S = 1200
# At the target (≥ 100 steps/s) a run takes under a minute. A runtime far slower than that would
# make `make bench` last most of an hour, so runs after the first are started only while they fit
# in this budget; the figure then says how many runs it is the median of.
BUDGET_S = 300


def run(options: dict) -> dict:
    sessions, steps = QUICK_SHAPE if options["quick"] else FULL_SHAPE
    tenant, owner = new_owner("load")
    with workers(WORKER_PROCESSES):
        runs = runs_within_budget(lambda: measure(tenant, owner, sessions, steps), options["runs"])
    shape = f"{sessions} × {steps}"
    fairness = median_fairness(runs)
    slowest = max(runs, key=lambda r: r["mid_run_max"])
    return {
        "figures": [
            # Fewer runs than asked when the first ones used up the time budget (BUDGET_S).
            figure(f"{shape}: runs (the medians below)", len(runs), f"of {options['runs']}"),
            figure(f"{shape}: steps/s", median_of_runs(runs, "steps_per_s"), "", target(">=", 100)),
            figure(f"{shape}: wall time", median_of_runs(runs, "wall_s"), "s"),
            figure(f"{shape}: step latency p50", median_of_runs(runs, "latency_p50_ms"), "ms"),
            figure(f"{shape}: step latency p95", median_of_runs(runs, "latency_p95_ms"), "ms"),
            figure(
                f"{shape}: fairness, max/min at mid-run",
                fairness,
                "×",
                target("<=", 2, "×"),
                note=f"∞ (min {slowest['mid_run_min']}, max {slowest['mid_run_max']} steps)",
            ),
        ],
        "details": runs,
    }


def median_fairness(runs: list[dict]) -> float | None:
    """None (∞) counts as the largest value, not as a missing one."""
    value = statistics.median(math.inf if r["fairness"] is None else r["fairness"] for r in runs)
    return None if math.isinf(value) else value


def runs_within_budget(measure_once, wanted: int) -> list[dict]:
    began = time.monotonic()
    runs = [measure_once()]
    while len(runs) < wanted and (time.monotonic() - began) * (len(runs) + 1) / len(runs) <= BUDGET_S:
        runs.append(measure_once())
    return runs


def measure(tenant, owner, count: int, steps: int) -> dict:
    from sessions_app.runtime import brain

    sessions = [new_session(tenant, owner, f"load {i}") for i in range(count)]
    ids = [s.pk for s in sessions]
    started = time.time()
    for session in sessions:
        brain.submit_input(session, kind="message", text=directive_message(steps))
    mid_run = wait_until_done(ids, count * steps)
    finished = last_turn_end(ids)
    total = sum(progress(ids).values())
    latencies = step_latencies(ids)
    return {
        "steps": total,
        "wall_s": finished - started,
        "steps_per_s": total / (finished - started),
        "latency_p50_ms": percentile(latencies, 0.50),
        "latency_p95_ms": percentile(latencies, 0.95),
        "fairness": max(mid_run) / min(mid_run) if min(mid_run) else None,
        "mid_run_min": min(mid_run),
        "mid_run_max": max(mid_run),
    }


def progress(ids) -> dict:
    """Steps done so far per Session (0 for a Session whose turn has not started)."""
    from sessions_app.models import Turn

    done = dict.fromkeys(ids, 0)
    done.update(Turn.objects.filter(session_id__in=ids).values_list("session_id", "steps"))
    return done


def wait_until_done(ids, expected_steps: int) -> list[int]:
    """Poll until every turn has ended; returns the steps per Session seen at mid-run."""
    from sessions_app.models import Turn

    mid_run = None
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        done = progress(ids)
        if mid_run is None and sum(done.values()) >= expected_steps / 2:
            mid_run = list(done.values())
        if Turn.objects.filter(session_id__in=ids, ended_at__isnull=False).count() == len(ids):
            return mid_run or list(done.values())
        time.sleep(POLL_S)
    raise TimeoutError(f"the turns did not all end within {TIMEOUT_S} s")


def last_turn_end(ids) -> float:
    from django.db.models import Max

    from sessions_app.models import Turn

    return Turn.objects.filter(session_id__in=ids).aggregate(last=Max("ended_at"))["last"].timestamp()


def step_latencies(ids) -> list[float]:
    """Milliseconds between consecutive model calls of the same Session, all Sessions pooled."""
    from sessions_app.models import ModelCall

    latencies, previous = [], {}
    for session_id, started in (
        ModelCall.objects.filter(session_id__in=ids)
        .order_by("session_id", "pk")
        .values_list("session_id", "started_at")
    ):
        if session_id in previous:
            latencies.append((started - previous[session_id]).total_seconds() * 1000)
        previous[session_id] = started
    return latencies
