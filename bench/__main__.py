"""`python -m bench` (`make bench`): the runtime's figures on SQLite and on PostgreSQL + Redis.

Each scenario runs in a child process per database (bench.child) and each figure is the median
of `--runs` runs (3; `--quick`: 1 run and smaller N). Prints a table and writes
bench/results/<UTC timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import report
from .backends import PROJECT_ROOT, Backend, backends
from .child import RESULT_PREFIX
from .scenarios import SCENARIOS

CHILD_TIMEOUT_S = 900


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 run per figure and smaller N (a smoke run)")
    parser.add_argument(
        "--only", action="append", choices=list(SCENARIOS), help="run only this scenario (repeatable)"
    )
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], help="run on one database only")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure, at least 3 unless --quick")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    runs = 1 if args.quick else max(3, args.runs)
    scenarios = args.only or list(SCENARIOS)
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="xagent-bench-"))
    results: dict = {}
    chosen = [b for b in backends(root) if args.backend in (None, b.name)]
    try:
        for backend in chosen:
            results[backend.name] = run_backend(backend, scenarios, {"runs": runs, "quick": args.quick})
    finally:
        for backend in chosen:
            if backend.prepared:
                backend.cleanup()
        if any_error(results):
            print(f"A scenario failed: its logs are kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    results["comparison"] = report.comparison_figures(results)
    elapsed = time.monotonic() - started
    titles = {name: SCENARIOS[name].title for name in scenarios}
    print()
    print(report.render(results, titles, {b.name: b.label for b in chosen}))
    path = report.write(
        {
            "runs": runs,
            "quick": args.quick,
            "elapsed_s": round(elapsed, 1),
            "machine": machine(),
            "results": results,
        }
    )
    print(
        f"\n{runs} run(s) per figure, medians; total {elapsed:.0f} s; written to {path.relative_to(PROJECT_ROOT)}"
    )
    return 0


def any_error(results: dict) -> bool:
    return any("error" in outcome for backend in results.values() for outcome in backend.values())


def machine() -> dict:
    """What the figures depend on besides the code: comparable only on the same machine."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True)
    return {
        "commit": commit.stdout.strip(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def run_backend(backend: Backend, scenarios: list[str], options: dict) -> dict:
    reason = backend.unavailable()
    if reason:
        print(f"{backend.label}: skipped: {reason}", flush=True)
        return {name: {"skipped": f"skipped: {reason}"} for name in scenarios}
    print(f"{backend.label}: migrating a template database…", flush=True)
    backend.root.mkdir(parents=True, exist_ok=True)
    backend.prepared = True  # from here on there is something to clean up
    backend.prepare()
    outcomes = {}
    for name in scenarios:
        scenario = SCENARIOS[name]
        if backend.name == "sqlite" and scenario.sqlite_skip:
            outcomes[name] = {"skipped": f"skipped: {scenario.sqlite_skip}"}
            continue
        began = time.monotonic()
        outcomes[name] = run_child(backend, name, {**options, "backend": backend.name})
        status = outcomes[name].get("error", "done")
        print(f"  {backend.label} / {name}: {status} ({time.monotonic() - began:.0f} s)", flush=True)
    return outcomes


def run_child(backend: Backend, name: str, options: dict) -> dict:
    env = backend.child_env()
    log_path = backend.root / f"{name}.log"
    with open(log_path, "w") as log:
        # A session of its own: on a timeout the whole group (daphne, workers it started) goes.
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.child", name, json.dumps(options)],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, _ = child.communicate(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            return {"error": f"timed out after {CHILD_TIMEOUT_S} s"}
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
            if "error" in result:
                result["log_tail"] = log_path.read_text(errors="replace")[-4000:]
                print(result["log_tail"], file=sys.stderr)
            return result
    tail = log_path.read_text(errors="replace")[-4000:]
    print(tail, file=sys.stderr)
    return {"error": f"the child exited with {child.returncode} and no result", "log_tail": tail}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
