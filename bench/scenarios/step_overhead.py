"""Step overhead: N tool-call steps in ONE turn with the in-process zero-latency model and a
trivial read-only tool (`fs_list`), driven in this process slice after slice.

A step's cost is the time between two consecutive model calls (stamped by the model): assemble,
evidence, the assistant message, the tool, its result, the slice boundaries — all of the
harness, none of the model. Queries are counted the same way.
"""

from __future__ import annotations

import statistics

from ..figures import figure, target
from ..harness import (
    median_of_runs,
    new_owner,
    new_session,
    peak_rss_mib,
    run_turn_in_process,
    step_intervals,
    stored_bytes,
    window_mean,
)
from ..models import directive_message

FULL_SIZES = (10, 100, 500)
QUICK_SIZES = (10, 100)
WINDOW = 0.10  # first and last 10% of the steps
MIB = 1024 * 1024


def run(options: dict) -> dict:
    tenant, owner = new_owner("steps")
    run_turn_in_process(new_session(tenant, owner, "warm-up"), directive_message(5), 5)  # imports, caches
    sizes = QUICK_SIZES if options["quick"] else FULL_SIZES
    figures, details = [], {}
    for steps in sizes:
        runs = [measure_turn(tenant, owner, steps) for _ in range(options["runs"])]
        details[f"N={steps}"] = runs
        figures += figures_for(steps, runs)
    return {"figures": figures, "details": details}


def measure_turn(tenant, owner, steps: int) -> dict:
    session = new_session(tenant, owner, f"{steps} steps")
    before = stored_bytes()
    run_turn_in_process(session, directive_message(steps), steps)
    stored = stored_bytes() - before
    millis, queries = step_intervals()
    return {
        "steps": len(millis),
        "ms_mean": statistics.fmean(millis),
        "ms_first": window_mean(millis, WINDOW, last=False),
        "ms_last": window_mean(millis, WINDOW, last=True),
        "growth": window_mean(millis, WINDOW, last=True) / window_mean(millis, WINDOW, last=False),
        "queries_first": window_mean(queries, WINDOW, last=False),
        "queries_last": window_mean(queries, WINDOW, last=True),
        "stored_bytes": stored,
        "bytes_per_step": stored / len(millis),
        "peak_rss_mib": peak_rss_mib(),
    }


def figures_for(steps: int, runs: list[dict]) -> list[dict]:
    def median(key):
        return median_of_runs(runs, key)

    at = f"N={steps}"
    figures = [
        figure(
            f"{at}: ms/step, mean", median("ms_mean"), "ms", target("<=", 4, "ms") if steps == 10 else None
        ),
        figure(f"{at}: ms/step, first 10%", median("ms_first"), "ms"),
        figure(
            f"{at}: ms/step, last 10%",
            median("ms_last"),
            "ms",
            target("<=", 5, "ms") if steps == max(FULL_SIZES) else None,
        ),
        figure(f"{at}: growth, last/first 10%", median("growth"), "×", target("<=", 1.3, "×")),
        figure(f"{at}: queries/step, first 10%", median("queries_first"), "", target("<=", 12)),
        figure(f"{at}: queries/step, last 10%", median("queries_last"), "", target("<=", 12)),
        figure(f"{at}: stored bytes/step", median("bytes_per_step"), "B"),
        figure(
            f"{at}: stored for the run",
            median("stored_bytes") / MIB,
            "MiB",
            target("<=", 5, "MiB") if steps == max(FULL_SIZES) else None,
        ),
        figure(f"{at}: worker peak RSS", median("peak_rss_mib"), "MiB"),
    ]
    return figures
