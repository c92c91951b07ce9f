"""Short turns: K new Sessions, each one turn of 5 steps (4 `fs_list` calls and the answer), driven
one after another in this process with the in-process zero-latency model.

Scenario 1 measures a step inside a long turn; this one measures what a turn costs around its
steps — the message that starts it, the slice's first read of the Session's context, the
delivery record at its end, the runner's claim and release — spread over its 5 steps, which is
the shape of `slow_model` (and of most real turns). The figures are CPU milliseconds of this
process per step (`time.process_time`: what a worker pays, not what it waited) and statements
per turn (a count: repeatable on any machine, so a change shows even where timings are noisy).
"""

from __future__ import annotations

import time

from ..figures import figure
from ..harness import median_of_runs, new_owner, new_session, run_turn_in_process
from ..models import directive_message
from ..probe import QUERIES

STEPS = 5  # model calls per turn: 4 tool-call steps and the answer
TOOL_STEPS = STEPS - 1
FULL_SESSIONS = 100
QUICK_SESSIONS = 30


def run(options: dict) -> dict:
    tenant, owner = new_owner("turns")
    run_turn_in_process(new_session(tenant, owner, "warm-up"), directive_message(TOOL_STEPS), TOOL_STEPS)
    sessions = QUICK_SESSIONS if options["quick"] else FULL_SESSIONS
    runs = [measure(tenant, owner, sessions) for _ in range(options["runs"])]
    at = f"K={sessions}"

    def median(key):
        return median_of_runs(runs, key)

    figures = [
        figure(f"{at}: CPU per step (turn included)", median("cpu_ms_per_step"), "ms"),
        figure(f"{at}: CPU per turn", median("cpu_ms_per_turn"), "ms"),
        figure(f"{at}: statements per turn", median("queries_per_turn"), ""),
    ]
    return {"figures": figures, "details": {at: runs}}


def measure(tenant, owner, sessions: int) -> dict:
    created = [new_session(tenant, owner, f"short turn {i}") for i in range(sessions)]
    message = directive_message(TOOL_STEPS)
    queries, cpu = QUERIES.count, time.process_time()
    for session in created:
        run_turn_in_process(session, message, TOOL_STEPS)
    cpu_ms = (time.process_time() - cpu) * 1000
    return {
        "sessions": sessions,
        "cpu_ms_per_step": cpu_ms / (sessions * STEPS),
        "cpu_ms_per_turn": cpu_ms / sessions,
        "queries_per_turn": (QUERIES.count - queries) / sessions,
    }
